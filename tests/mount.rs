//! Lazy mounts end to end: real FUSE, real registry, real faults.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::model::{write_safetensors, TensorSpec};
use crate::support::mount::{fuse_available, Mount};
use crate::support::oci::pseudo_random;
use crate::support::proxy::{BlobGet, Fault, Proxy};
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::Server;

/// A safetensors header read through the mount, as a loader reads it.
struct Header {
    /// Bytes before the first tensor: the 8-byte length and the JSON.
    len: u64,
    json: serde_json::Value,
}

impl Header {
    fn read(f: &std::fs::File) -> Header {
        let mut len = [0u8; 8];
        f.read_exact_at(&mut len, 0).unwrap();
        let n = u64::from_le_bytes(len);
        let mut json = vec![0u8; n as usize];
        f.read_exact_at(&mut json, 8).unwrap();
        Header {
            len: 8 + n,
            json: serde_json::from_slice(&json).unwrap(),
        }
    }

    /// A tensor's byte range in the file.
    fn tensor(&self, name: &str) -> (u64, u64) {
        let o = &self.json[name]["data_offsets"];
        (
            self.len + o[0].as_u64().unwrap(),
            self.len + o[1].as_u64().unwrap(),
        )
    }
}

fn checkpoint(dir: &Path, shards: u64, seed: u64) {
    std::fs::create_dir_all(dir.join("tokenizer")).unwrap();
    for s in 0..shards {
        let tensors: Vec<_> = (0..12u64)
            .map(|t| {
                (
                    format!("layer.{t}.w"),
                    800_000 + (t as usize * 90_000),
                    seed + s * 100 + t,
                )
            })
            .collect();
        write_safetensors(&dir.join(format!("model-{s:05}.safetensors")), &tensors);
    }
    std::fs::write(dir.join("config.json"), br#"{"layers": 12}"#).unwrap();
    std::fs::write(
        dir.join("tokenizer/vocab.txt"),
        pseudo_random(100_000, seed),
    )
    .unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
    std::fs::write(dir.join("run.sh"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("config.json", dir.join("config.link")).unwrap();
}

/// Writes `files` (name, size, seed) of pseudo-random bytes into `home/src` and pushes them as
/// `{server}/weights/{name}:v1`. Returns the source directory and the push report.
fn push_files(
    server: &Server,
    home: &Path,
    name: &str,
    files: &[(&str, usize, u64)],
) -> (PathBuf, serde_json::Value) {
    push_written(server, home, name, |src| {
        for (file, size, seed) in files {
            std::fs::write(src.join(file), pseudo_random(*size, *seed)).unwrap();
        }
    })
}

/// Safetensors files (name, tensors) in `home/src`, pushed as `weights/<name>:v1`.
fn push_safetensors(
    server: &Server,
    home: &Path,
    name: &str,
    files: &[(String, Vec<TensorSpec>)],
) -> PathBuf {
    let (src, _) = push_written(server, home, name, |src| {
        for (file, tensors) in files {
            write_safetensors(&src.join(file), tensors);
        }
    });
    src
}

/// Fills `home/src` with `write` and pushes it as `weights/<name>:v1`.
fn push_written(
    server: &Server,
    home: &Path,
    name: &str,
    write: impl FnOnce(&Path),
) -> (PathBuf, serde_json::Value) {
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write(&src);
    let reference = format!("{}/weights/{name}", server.addr);
    let report = push_json(home, &src, &reference, &["--tag", "v1"]);
    (src, report)
}

#[test]
fn a_mounted_volume_reads_back_byte_for_byte_and_refuses_writes() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    checkpoint(&src, 2, 1);
    let reference = format!("{}/weights/mounted", server.addr);
    let pinned = push_json(home.path(), &src, &reference, &["--tag", "v1"])["reference"]
        .as_str()
        .unwrap()
        .to_owned();

    let started = Instant::now();
    let m = Mount::new(home.path(), &format!("{reference}:v1"), "mnt", &[]);
    eprintln!("mount ready in {:?}", started.elapsed());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        mounts.contains(&format!("vial:{pinned} {}", m.path.display())),
        "the source names the pinned digest: {mounts}"
    );
    assert_eq!(m.stats()["bytes_fetched"], 0, "metadata must need no chunk");

    assert_same_tree(&src, &m.path);
    for (what, result) in [
        ("create", std::fs::write(m.path.join("new"), b"x").err()),
        (
            "truncate",
            std::fs::OpenOptions::new()
                .write(true)
                .open(m.path.join("config.json"))
                .err(),
        ),
        ("mkdir", std::fs::create_dir(m.path.join("d")).err()),
        (
            "remove",
            std::fs::remove_file(m.path.join("config.json")).err(),
        ),
    ] {
        let err = result.unwrap_or_else(|| panic!("{what} must fail on a read-only mount"));
        assert_eq!(
            err.raw_os_error(),
            Some(30),
            "{what}: expected EROFS, got {err}"
        );
    }
    vial_ok(home.path(), &["umount", m.path.to_str().unwrap()]);
    assert!(!m.is_mounted());
}

#[test]
fn reading_one_tensor_fetches_only_its_chunks() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let shards = 4u64;
    let files: Vec<_> = (0..shards)
        .map(|s| {
            let tensors = (0..10u64)
                .map(|t| (format!("t{t}"), 3_000_000, s * 100 + t))
                .collect();
            (format!("model-{s}.safetensors"), tensors)
        })
        .collect();
    let src = push_safetensors(&server, home.path(), "one-tensor", &files);
    let total: u64 = files
        .iter()
        .map(|(name, _)| std::fs::metadata(src.join(name)).unwrap().len())
        .sum();
    let reference = format!("{}/weights/one-tensor:v1", server.addr);
    let m = Mount::new(home.path(), &reference, "mnt", &[]);

    // Tensor t5 of the last shard: find it in the header, read it, compare.
    let path = m.path.join(format!("model-{}.safetensors", shards - 1));
    let f = std::fs::File::open(&path).unwrap();
    let header = Header::read(&f);
    let n = header.len - 8;
    let (b, e) = header.tensor("t5");
    let mut tensor = vec![0u8; (e - b) as usize];
    f.read_exact_at(&mut tensor, b).unwrap();
    assert_eq!(tensor, pseudo_random((e - b) as usize, 300 + 5));

    let fetched = m.stats()["bytes_fetched"].as_u64().unwrap();
    eprintln!(
        "fetched {fetched} bytes for a {} byte tensor of a {total} byte volume",
        e - b
    );
    assert!(fetched >= e - b);
    assert!(
        fetched <= (e - b) + 16 * 1024 * 1024 + n + 8,
        "fetched {fetched} for a tensor of {}",
        e - b
    );
    assert!(
        fetched * 4 < total,
        "a lazy read must not fetch most of the volume"
    );
}

#[test]
fn reading_the_start_of_a_tensor_fetches_the_rest_of_it_and_nothing_beyond() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    // 3 MB, 24 MB and 30 MB tensors: the middle one is about ten chunks.
    let tensors = vec![
        ("a".to_string(), 1_500_000, 1),
        ("big".to_string(), 12_000_000, 2),
        ("c".to_string(), 15_000_000, 3),
    ];
    let files = [("model.safetensors".to_string(), tensors)];
    push_safetensors(&server, home.path(), "tensor-ahead", &files);
    let reference = format!("{}/weights/tensor-ahead:v1", server.addr);
    let m = Mount::new(home.path(), &reference, "mnt", &[]);

    // A loader reads the header, then the tensor; here only the tensor's first 4 KiB.
    let f = std::fs::File::open(m.path.join("model.safetensors")).unwrap();
    let header = Header::read(&f);
    let ((a_start, a_end), (b, e)) = (header.tensor("a"), header.tensor("big"));
    let mut first = vec![0u8; 4096];
    f.read_exact_at(&mut first, b).unwrap();
    assert_eq!(first, pseudo_random(4096, 2));

    // The rest of the tensor arrives without being asked for.
    let header_bytes = header.len;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut fetched = 0;
    while Instant::now() < deadline {
        fetched = m.stats()["bytes_fetched"].as_u64().unwrap();
        if fetched >= header_bytes + (e - b) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        fetched >= header_bytes + (e - b),
        "only {fetched} bytes fetched: the tensor was not read ahead"
    );
    // And nothing of the next tensor: chunks end at tensor boundaries. (The kernel's own
    // read-ahead after the header may have asked for the first tensor.) Checked once the mount
    // has nothing on its way: every fetch the reads above set off has finished.
    m.wait_idle();
    let stats = m.stats();
    let fetched = stats["bytes_fetched"].as_u64().unwrap();
    assert!(
        fetched <= header_bytes + (a_end - a_start) + (e - b),
        "{fetched} bytes fetched: more than the header, the first tensor and the one read"
    );
    assert!(stats["prefetched_chunks"].as_u64().unwrap() > 0, "{stats}");
}

#[test]
fn a_volume_three_times_the_cache_reads_fully_and_versions_share_the_cache() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..6u64 {
        std::fs::write(
            src.join(format!("part-{i}.bin")),
            pseudo_random(32 << 20, 70 + i),
        )
        .unwrap();
    }
    let reference = format!("{}/weights/bigger-than-cache", server.addr);
    push_json(home.path(), &src, &reference, &["--tag", "v1"]);
    // v2 changes one file of six.
    let src2 = home.path().join("src2");
    std::fs::create_dir_all(&src2).unwrap();
    for i in 0..6u64 {
        std::os::unix::fs::symlink(src.join(format!("part-{i}.bin")), src2.join("tmp")).ok();
        std::fs::remove_file(src2.join("tmp")).ok();
        std::fs::copy(
            src.join(format!("part-{i}.bin")),
            src2.join(format!("part-{i}.bin")),
        )
        .unwrap();
    }
    std::fs::write(src2.join("part-5.bin"), pseudo_random(32 << 20, 999)).unwrap();
    push_json(home.path(), &src2, &reference, &["--tag", "v2"]);

    // No background prefetch: it would fill and evict the shared cache while the reads below
    // count what they fetch, and v2's own prefetch would count as fetched by its read.
    let v1 = Mount::new(
        home.path(),
        &format!("{reference}:v1"),
        "v1",
        &["--cache-size", "64MiB", "--prefetch", "none"],
    );
    let v2 = Mount::new(
        home.path(),
        &format!("{reference}:v2"),
        "v2",
        &["--cache-size", "64MiB", "--prefetch", "none"],
    );
    // 192 MiB through a 64 MiB cache: evictions happen and every byte is still right.
    assert_same_tree(&src, &v1.path);
    let s1 = v1.stats();
    assert!(s1["evictions"].as_u64().unwrap() > 0, "{s1}");
    assert!(s1["cache_bytes"].as_u64().unwrap() <= 64 << 20);

    // What v1 read last is still cached: the tree comparison read the files in the tree's order,
    // so part-4 and part-5 were the last 64 MiB it read, all the cache holds. v1 reads part-4
    // again from the chunk cache, fetching nothing, which makes it the most recently used half.
    // The kernel keeps a mounted file's pages across opens, so they are dropped first (dd's
    // `iflag=nocache count=0` is a posix_fadvise DONTNEED of the whole file): the read must reach
    // the mount.
    let v1_part = v1.path.join("part-4.bin");
    let dropped = std::process::Command::new("dd")
        .arg(format!("if={}", v1_part.display()))
        .args(["iflag=nocache", "count=0", "status=none"])
        .status()
        .unwrap();
    assert!(dropped.success());
    let (served, fetched) = (
        v1.stats()["bytes_read"].as_u64().unwrap(),
        v1.stats()["bytes_fetched"].as_u64().unwrap(),
    );
    let mut buf = Vec::new();
    std::fs::File::open(&v1_part)
        .unwrap()
        .read_to_end(&mut buf)
        .unwrap();
    let served = v1.stats()["bytes_read"].as_u64().unwrap() - served;
    assert!(
        served >= 32 << 20,
        "v1 served {served} bytes of part-4: the page cache did"
    );
    let fetched = v1.stats()["bytes_fetched"].as_u64().unwrap() - fetched;
    assert_eq!(fetched, 0, "v1 fetched again some of what it read last");
    buf.clear();
    let before = v2.stats()["bytes_fetched"].as_u64().unwrap();
    std::fs::File::open(v2.path.join("part-4.bin"))
        .unwrap()
        .read_to_end(&mut buf)
        .unwrap();
    assert_eq!(buf, std::fs::read(src.join("part-4.bin")).unwrap());
    // v2's part-4 is v1's byte for byte, and chunks are cut within a file from its bytes alone
    // (docs/format.md), so every chunk of it is one v1 holds: v2 has nothing to fetch.
    let after = v2.stats()["bytes_fetched"].as_u64().unwrap();
    assert_eq!(
        after - before,
        0,
        "v2 fetched bytes of a file v1 had just cached"
    );
    assert_same_tree(&src2, &v2.path);
}

#[test]
fn corrupt_chunks_are_eio_and_a_dead_registry_fails_reads_in_bounded_time() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let proxy = Proxy::start(&server.addr);
    let home = tempfile::tempdir().unwrap();
    let (src, _) = push_files(
        &server,
        home.path(),
        "faults",
        &[
            ("a.bin", 3 << 20, 1),
            ("b.bin", 3 << 20, 2),
            ("c.bin", 3 << 20, 3),
        ],
    );
    let m = Mount::new(
        home.path(),
        &format!("{}/weights/faults:v1", proxy.addr),
        "mnt",
        &["--timeout", "5s"],
    );

    proxy.set(Fault::Corrupt);
    let err = std::fs::read(m.path.join("a.bin")).expect_err("corrupt bytes must never be served");
    assert_eq!(err.raw_os_error(), Some(5), "expected EIO, got {err}");

    // Transient 503s are retried and the read succeeds.
    proxy.take_answered();
    proxy.set(Fault::Unavailable(2));
    assert_eq!(
        std::fs::read(m.path.join("a.bin")).unwrap(),
        std::fs::read(src.join("a.bin")).unwrap()
    );
    let gets = proxy.take_answered();
    assert_eq!(
        proxy.fault(),
        Fault::Unavailable(0),
        "the read never met the injected 503s"
    );
    assert_eq!(
        gets.iter().filter(|g| g.status == 503).count(),
        2,
        "{gets:?}"
    );
    // Every chunk a 503 refused was then fetched whole.
    for refused in gets.iter().filter(|g| g.status == 503) {
        assert!(
            gets.iter()
                .any(|g| g.digests == refused.digests && g.status == 200 && g.bytes > 0),
            "{:?} was never fetched after its 503: {gets:?}",
            refused.digests
        );
    }

    // A stalled registry is timed out.
    proxy.set(Fault::Stall);
    let started = Instant::now();
    let err = std::fs::read(m.path.join("b.bin")).expect_err("a stalled fetch must fail");
    assert_eq!(err.raw_os_error(), Some(5));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the read hung for {:?}",
        started.elapsed()
    );

    // The registry gone: EIO, not a hang.
    proxy.set(Fault::None);
    drop(server);
    let started = Instant::now();
    let err =
        std::fs::read(m.path.join("c.bin")).expect_err("reads must fail with the registry gone");
    assert_eq!(err.raw_os_error(), Some(5));
    assert!(started.elapsed() < Duration::from_secs(60));
    // What was cached is still served.
    assert_eq!(
        std::fs::read(m.path.join("a.bin")).unwrap(),
        std::fs::read(src.join("a.bin")).unwrap()
    );
    assert!(m.stats()["fetch_errors"].as_u64().unwrap() >= 2);
}

#[test]
fn sequential_reads_fetch_ahead_in_bulk_and_a_bad_bulk_read_is_eio() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let proxy = Proxy::start(&server.addr);
    let home = tempfile::tempdir().unwrap();
    let (src, _) = push_files(
        &server,
        home.path(),
        "bulk",
        &[("a.bin", 48 << 20, 21), ("b.bin", 48 << 20, 22)],
    );
    let m = Mount::new(
        home.path(),
        &format!("{}/weights/bulk:v1", proxy.addr),
        "mnt",
        &["--timeout", "10s"],
    );
    let read_sequentially = |name: &str| -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::File::open(m.path.join(name))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    };

    proxy.take_answered();
    assert!(read_sequentially("a.bin").unwrap() == std::fs::read(src.join("a.bin")).unwrap());
    let gets = proxy.take_answered();
    let bulk = gets.iter().filter(|g| g.digests.len() > 1).count();
    assert!(bulk > 0, "no bulk reads: {gets:?}");
    // A request per chunk would be as many requests as a.bin has chunks (all fetched now).
    let fetched = m.stats()["chunks_fetched"].as_u64().unwrap() as usize;
    assert!(
        gets.len() < fetched,
        "{} requests for {fetched} chunks: {gets:?}",
        gets.len()
    );
    assert!(m.stats()["prefetched_chunks"].as_u64().unwrap() > 0);

    // A corrupted bulk read: the chunks that matched are kept, the one that did not is fetched
    // again on its own, corrupted again, and the read fails with EIO; no wrong byte is served.
    // The first third of b.bin arrives intact first, so the reader is known to be sequential and
    // chunks ahead of it come from bulk reads (read-ahead). The reader goes on past each EIO in
    // steps smaller than the smallest chunk, comparing every byte it is given, until the chunk
    // a corrupt bulk read failed to deliver has been asked for on its own: a reader may outrun
    // read-ahead and fail first on a chunk it fetched alone, so where it fails is not fixed.
    let mut f = std::fs::File::open(m.path.join("b.bin")).unwrap();
    let mut head = vec![0u8; 16 << 20];
    f.read_exact(&mut head).unwrap();
    m.wait_idle();
    proxy.take_answered();
    proxy.set(Fault::Corrupt);
    let source = std::fs::read(src.join("b.bin")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut corrupted: Vec<BlobGet> = Vec::new();
    let mut errors = Vec::new();
    let mut at = head.len();
    let refetched_alone = |gets: &[BlobGet]| {
        gets.iter().filter(|g| g.digests.len() == 1).any(|single| {
            gets.iter()
                .any(|b| b.digests.len() > 1 && b.digests.contains(&single.digests[0]))
        })
    };
    while at < source.len() && (errors.is_empty() || !refetched_alone(&corrupted)) {
        match f.read_at(&mut buf, at as u64) {
            Ok(0) => break,
            Ok(n) => {
                assert!(
                    buf[..n] == source[at..at + n],
                    "corrupt bytes must never be served: {n} bytes at {at} differ"
                );
                at += n;
            }
            Err(e) => {
                errors.push(e);
                at += 256 << 10;
            }
        }
        corrupted.extend(proxy.take_answered());
    }
    assert!(
        !errors.is_empty(),
        "no read failed while every body was corrupt"
    );
    for e in &errors {
        assert_eq!(e.raw_os_error(), Some(5), "expected EIO, got {e}");
    }
    m.wait_idle();
    corrupted.extend(proxy.take_answered());
    let bulk: Vec<&BlobGet> = corrupted.iter().filter(|g| g.digests.len() > 1).collect();
    let alone: Vec<&String> = corrupted
        .iter()
        .filter(|g| g.digests.len() == 1)
        .map(|g| &g.digests[0])
        .collect();
    assert!(!bulk.is_empty(), "no bulk read to corrupt: {corrupted:?}");
    assert!(
        alone
            .iter()
            .any(|d| bulk.iter().any(|b| b.digests.contains(d))),
        "a chunk that arrived corrupt in a bulk read is fetched again on its own: {corrupted:?}"
    );
    // The proxy flips one byte in the middle of each body, and a bulk read's body is its chunks
    // end to end, in order: every chunk before the first one fetched again on its own arrived
    // intact, and is kept.
    let kept: BTreeSet<&String> = bulk
        .iter()
        .filter_map(|b| {
            let first_bad = b.digests.iter().position(|d| alone.contains(&d))?;
            Some(&b.digests[..first_bad])
        })
        .flatten()
        .collect();
    assert!(
        !kept.is_empty(),
        "no chunk arrived intact before a corrupt one: {corrupted:?}"
    );
    proxy.set(Fault::None);
    assert!(read_sequentially("b.bin").unwrap() == std::fs::read(src.join("b.bin")).unwrap());
    let refetched: Vec<String> = proxy
        .take_answered()
        .into_iter()
        .flat_map(|g| g.digests)
        .filter(|d| kept.contains(d))
        .collect();
    assert!(
        refetched.is_empty(),
        "chunks that matched were not kept: fetched again {refetched:?}"
    );
}

#[test]
fn concurrent_readers_get_the_same_bytes_and_each_chunk_is_fetched_once() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (src, report) = push_files(
        &server,
        home.path(),
        "concurrent",
        &[("shared.bin", 40 << 20, 5)],
    );
    let m = Mount::new(
        home.path(),
        &format!("{}/weights/concurrent:v1", server.addr),
        "mnt",
        &[],
    );
    let expected = std::fs::read(src.join("shared.bin")).unwrap();
    let readers: Vec<_> = (0..6)
        .map(|i| {
            let path = m.path.join("shared.bin");
            std::thread::spawn(move || {
                let f = std::fs::File::open(&path).unwrap();
                let mut out = vec![0u8; 40 << 20];
                // Each reader walks the file in a different order of 1 MiB blocks (a stride coprime
                // with 40 visits every block once).
                let stride = [1, 3, 7, 9, 11, 13][i];
                let blocks: Vec<usize> = (0..40).map(|b| (b * stride) % 40).collect();
                for b in blocks {
                    f.read_exact_at(&mut out[b << 20..(b + 1) << 20], (b as u64) << 20)
                        .unwrap();
                }
                out
            })
        })
        .collect();
    for r in readers {
        assert!(r.join().unwrap() == expected);
    }
    let s = m.stats();
    assert_eq!(
        s["chunks_fetched"], report["chunks"],
        "each chunk is fetched exactly once: {s}"
    );
}

#[test]
fn umount_with_open_files_and_a_killed_mount_process() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (src, _) = push_files(&server, home.path(), "lifecycle", &[("w.bin", 5 << 20, 8)]);
    let reference = format!("{}/weights/lifecycle:v1", server.addr);

    // Busy: a plain umount refuses and says why; a lazy one detaches and open files keep working.
    let m = Mount::new(home.path(), &reference, "mnt", &[]);
    let open = std::fs::File::open(m.path.join("w.bin")).unwrap();
    let busy = vial(home.path(), &["umount", m.path.to_str().unwrap()]);
    assert!(!busy.status.success());
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains("busy"),
        "{}",
        String::from_utf8_lossy(&busy.stderr)
    );
    vial_ok(home.path(), &["umount", "--lazy", m.path.to_str().unwrap()]);
    assert!(!m.is_mounted());
    let mut buf = vec![0u8; 5 << 20];
    open.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, std::fs::read(src.join("w.bin")).unwrap());
    let first = m.path.clone();
    let first_pid = find_mount_pid(&first).expect("the first mount's process");
    drop(open);
    // The detached mount's process ends with its last open file, after writing its cache: the
    // remount below relies on that cache, so wait for the process, not for a time.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{first_pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the lazily detached mount's process did not end after its last file closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        processes_naming(&first, "mount-guard"),
        vec![],
        "a mount that ended cleanly lets its guard go"
    );

    // Killing the mount process unmounts (auto-unmount): no "transport endpoint is not connected".
    let m = Mount::new(home.path(), &reference, "mnt2", &[]);
    let pid = find_mount_pid(&m.path).expect("the mount process");
    // fusermount3's auto-unmount helper (or the mount's guard) does it once the process is gone.
    kill_and_expect_detached(
        &m,
        pid,
        "the mountpoint was left mounted after the mount process died",
    );

    // fusermount3's helper misses a mount whose device closes after its socket (its check of the
    // mountpoint fails with ECONNABORTED, not ENOTCONN); the mount's guard then detaches it.
    // Killing the helper first leaves the guard alone to do it.
    let m = Mount::new(home.path(), &reference, "mnt2b", &[]);
    let pid = find_mount_pid(&m.path).expect("the mount process");
    let helpers = fusermount_helpers(&m.path);
    assert!(
        !helpers.is_empty(),
        "fusermount3 keeps a helper for an auto-unmounted mount"
    );
    for (helper, _) in helpers {
        crate::support::signal(helper, "KILL");
    }
    kill_and_expect_detached(
        &m,
        pid,
        "the guard did not detach the mount its process left behind",
    );

    // A remount after the crash serves from the surviving cache without fetching.
    let m = Mount::new(home.path(), &reference, "mnt3", &[]);
    assert_eq!(
        std::fs::read(m.path.join("w.bin")).unwrap(),
        std::fs::read(src.join("w.bin")).unwrap()
    );
    assert_eq!(
        m.stats()["bytes_fetched"],
        0,
        "the node cache survives the mount process"
    );
}

/// SIGKILLs the mount process `pid` and waits for its mount to go, as it must with no one
/// unmounting it by hand; `failure` says what it means if it does not.
fn kill_and_expect_detached(m: &Mount, pid: u32, failure: &str) {
    crate::support::signal(pid, "KILL");
    // On a loaded machine (the whole suite on two cores) that took over 10 s once.
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.is_mounted() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !m.is_mounted(),
        "{failure} ({})",
        unmount_witnesses(pid, &m.path)
    );
    assert!(
        std::fs::read_dir(&m.path).is_ok(),
        "the mountpoint must be usable again"
    );
}

/// What a failed auto-unmount leaves to look at: whether the killed process is gone (its state
/// if not) and which fusermount and guard processes still name the mountpoint.
fn unmount_witnesses(pid: u32, mountpoint: &Path) -> String {
    let state = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("State:"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "gone".into());
    let helpers = fusermount_helpers(mountpoint);
    let guards = processes_naming(mountpoint, "mount-guard");
    format!("killed process {pid}: {state}; fusermount helpers: {helpers:?}; guards: {guards:?}")
}

/// fusermount3 processes naming `mountpoint`: its auto-unmount helper, once the mount is made.
fn fusermount_helpers(mountpoint: &Path) -> Vec<(u32, String)> {
    processes_naming(mountpoint, "fusermount")
}

/// Processes whose command line holds `word` and `mountpoint`, with that command line.
fn processes_naming(mountpoint: &Path, word: &str) -> Vec<(u32, String)> {
    let needle = mountpoint.to_string_lossy();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains(word) && cmdline.contains(&*needle))
                .then(|| (pid, cmdline.trim().to_owned()))
        })
        .collect()
}

fn find_mount_pid(mountpoint: &Path) -> Option<u32> {
    let needle = mountpoint.to_str()?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "--foreground") && args.iter().any(|a| a == needle) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn mount_dot_vial_takes_mount8_arguments() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (src, _) = push_files(&server, home.path(), "fstab", &[("w.bin", 100_000, 3)]);
    // mount(8) runs /sbin/mount.vial SOURCE DIR -o OPTIONS; a link named mount.vial does the same.
    let helper = home.path().join("mount.vial");
    std::os::unix::fs::symlink(crate::support::vial_bin(), &helper).unwrap();
    let mp = home.path().join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let cache = home.path().join("cache");
    let out = std::process::Command::new(&helper)
        .arg(format!("{}/weights/fstab:v1", server.addr))
        .arg(&mp)
        .args([
            "-o",
            &format!(
                "ro,cache-dir={},cache-size=100MiB,prefetch=all",
                cache.display()
            ),
        ])
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount.vial failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Mount {
        path: mp.clone(),
        home: home.path().to_owned(),
    };
    assert_eq!(
        std::fs::read(mp.join("w.bin")).unwrap(),
        std::fs::read(src.join("w.bin")).unwrap()
    );
    assert_eq!(m.stats()["cache_limit"], 100 << 20);
}

#[test]
fn a_mount_refuses_a_non_empty_directory_and_names_what_fuse_lacks() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    push_files(&server, home.path(), "refuse", &[("w.bin", 10_000, 5)]);
    let reference = format!("{}/weights/refuse:v1", server.addr);
    // A directory with a file in it: mounting would hide the file.
    let busy = home.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("precious.txt"), b"mine").unwrap();
    let out = vial(home.path(), &["mount", &reference, busy.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not empty"), "{err}");
    assert_eq!(err.matches("vial: error:").count(), 1, "said once: {err}");
    assert_eq!(std::fs::read(busy.join("precious.txt")).unwrap(), b"mine");
    // Without fusermount3 on PATH, the error says which package to install, not that the
    // mountpoint is missing.
    let empty = home.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = std::process::Command::new(crate::support::vial_bin())
        .args(["mount", &reference, empty.to_str().unwrap()])
        .env("HOME", home.path())
        .env("PATH", home.path().join("no-such-bin"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fuse3"), "{err}");
    assert!(!err.contains("No such file or directory"), "{err}");
}
