//! Directories of any shape: thousands of small files push, pull, mount, copy and sync under the
//! open-file limit macOS gives a user (`ulimit -n 256`), and trees at the edges of what a file
//! system allows (10,000 entries in one directory, depth 64, names of 255 bytes, empty files and
//! directories, symlinks of every kind, a 100 GiB sparse file) come back exactly as they went.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::mount::{fuse_available, Mount};
use crate::support::oci::pseudo_random;
use crate::support::packs::OutOfPackOrder;
use crate::support::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use crate::support::vial::{assert_same_tree, vial_limited, vial_limited_ok};
use crate::support::{backend, require_all, Server};

/// Open files every process of these tests may hold: macOS's default for a user.
const NOFILE: u32 = 256;
const DIRS: usize = 200;
const PER_DIR: usize = 100;

/// A tree of `DIRS * PER_DIR` small files (0 to 4 KiB, every 97th empty, some executable) under
/// `root`, with a few symlinks beside them; with `posix` false, no symlinks and no executable
/// files (what a bucket can hold).
fn small_files(root: &Path, posix: bool) {
    for d in 0..DIRS {
        let dir = root.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..PER_DIR {
            let i = d * PER_DIR + f;
            let len = if i.is_multiple_of(97) {
                0
            } else {
                (i * 7919) % 4096 + 1
            };
            let path = dir.join(format!("f{f:03}.bin"));
            std::fs::write(&path, pseudo_random(len, i as u64 + 1)).unwrap();
            if posix && i.is_multiple_of(50) {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        if posix && d % 40 == 0 {
            std::os::unix::fs::symlink("f000.bin", dir.join("first")).unwrap();
        }
    }
}

fn count_files(root: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                n += 1;
            }
        }
    }
    n
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn twenty_thousand_files_push_pull_mount_and_copy_under_256_open_files() {
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let src = work.path().join("src");
    small_files(&src, true);
    let a = Server::start_limited(&work.path().join("a"), &[], NOFILE);
    let b = Server::start_limited(&work.path().join("b"), &[], NOFILE);
    let reference = format!("{}/indexes/small", a.addr);

    let pushed = json(&vial_limited_ok(
        &home,
        NOFILE,
        &[
            "push",
            src.to_str().unwrap(),
            &reference,
            "--tag",
            "v1",
            "--json",
        ],
    ));
    assert_eq!(pushed["files"], (DIRS * PER_DIR) as u64);
    let digest = pushed["digest"].as_str().unwrap().to_owned();

    // Pulled whole, then again over a copy with files cut short and one removed: the second
    // pull checks every file on disk and fetches only what is wrong.
    let out = work.path().join("pulled");
    vial_limited_ok(
        &home,
        NOFILE,
        &["pull", &format!("{reference}:v1"), out.to_str().unwrap()],
    );
    assert_same_tree(&src, &out);
    for d in (0..DIRS).step_by(3) {
        let f = out.join(format!("d{d:03}/f001.bin"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(1)
            .unwrap();
    }
    std::fs::remove_file(out.join("d007/f042.bin")).unwrap();
    let again = json(&vial_limited_ok(
        &home,
        NOFILE,
        &[
            "pull",
            &format!("{reference}:v1"),
            out.to_str().unwrap(),
            "--json",
        ],
    ));
    let fetched = again["chunks_downloaded"].as_u64().unwrap();
    assert!(
        (1..=DIRS as u64 / 3 + 2).contains(&fetched),
        "the damaged files' chunks only: {again}"
    );
    assert_same_tree(&src, &out);

    // Through a mount: every file read in tree order, as a program walking the tree would. The
    // walk is seen, and the files ahead of it arrive in bulk reads before they are opened.
    if fuse_available() {
        let mount = Mount::new_limited(&home, &format!("{reference}:v1"), "mnt", &[], NOFILE);
        assert_same_tree(&src, &mount.path);
        mount.wait_idle();
        let stats = mount.stats();
        assert_eq!(stats["fetch_errors"], 0, "{stats}");
        assert!(
            stats["prefetched_chunks"].as_u64().unwrap() > (DIRS * PER_DIR / 2) as u64,
            "most files were fetched ahead of the walk: {stats}"
        );
    } else {
        assert!(!require_all(), "FUSE is required for this test");
    }

    // Copied to another registry, then pulled from there.
    let copied = json(&vial_limited_ok(
        &home,
        NOFILE,
        &[
            "copy",
            &format!("{reference}:v1"),
            &format!("{}/indexes/small:v1", b.addr),
            "--json",
        ],
    ));
    assert_eq!(copied["digest"], digest.as_str());
    let from_b = work.path().join("from-b");
    vial_limited_ok(
        &home,
        NOFILE,
        &[
            "pull",
            &format!("{}/indexes/small:v1", b.addr),
            from_b.to_str().unwrap(),
        ],
    );
    assert_eq!(count_files(&from_b), DIRS * PER_DIR);
    assert_same_tree(&src, &from_b);
}

#[test]
fn a_bucket_of_twenty_thousand_files_syncs_under_256_open_files() {
    let Some(s3) = S3Server::start() else { return };
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    // s3s-fs keeps a bucket's objects as files: this is the bucket `indexes`.
    small_files(&s3.bucket_dir("indexes").join("run-1"), false);
    let secret = work.path().join("s3-secret");
    std::fs::write(&secret, format!("{SECRET_KEY}\n")).unwrap();
    let config = work.path().join("vial.toml");
    std::fs::write(
        &config,
        format!(
            "[[sync-sources]]\nprefix = \"s3://indexes\"\nendpoint = \"{}\"\nregion = \"us-east-1\"\naccess-key-id = \"{ACCESS_KEY}\"\nsecret-access-key = \"file:{}\"\n",
            s3.endpoint(),
            secret.display()
        ),
    )
    .unwrap();
    let server = Server::start_limited(
        &work.path().join("data"),
        &["--config", config.to_str().unwrap()],
        NOFILE,
    );
    let pinned = vial_limited_ok(
        &home,
        NOFILE,
        &[
            "sync",
            "start",
            "--source",
            "s3://indexes/run-1",
            "--dest",
            &format!("{}/indexes/synced:v1", server.addr),
            "--wait",
        ],
    );
    // The same files pushed from disk are the same version.
    let local = work.path().join("local");
    small_files(&local, false);
    let pushed = json(&vial_limited_ok(
        &home,
        NOFILE,
        &[
            "push",
            local.to_str().unwrap(),
            &format!("{}/indexes/pushed", server.addr),
            "--json",
        ],
    ));
    assert_eq!(
        pinned.trim().rsplit_once('@').unwrap().1,
        pushed["digest"].as_str().unwrap(),
        "the sync sealed what a push of the same files seals"
    );
}

/// A tree at the edges: 10,000 entries in one directory, a path 64 directories deep, names of
/// 255 bytes (a file and a directory), empty files and directories, symlinks (relative, absolute,
/// dangling, to a directory). On the embedded default, a 100 GiB sparse file too (it tests the
/// client and the format, not the stores: its bytes are one chunk of zeros, sent once).
/// A pull asks for small files' chunks in tree order, which need not be the order a push packed
/// them in: the registry gathers them from their packs and still answers in the order asked.
#[test]
fn small_chunks_read_in_another_order_than_their_packs_come_back_in_the_order_asked() {
    let server = Server::start();
    let chunks = OutOfPackOrder::send(&server.url(), "shapes/gathered");
    assert_eq!(chunks.read_and_check(&server.url(), "shapes/gathered"), 432);
}

#[test]
fn trees_at_the_edges_of_what_a_file_system_allows_come_back_exactly() {
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let src = work.path().join("src");
    let wide = src.join("wide");
    std::fs::create_dir_all(&wide).unwrap();
    for i in 0..10_000u64 {
        std::fs::write(wide.join(format!("{i:05}")), i.to_le_bytes()).unwrap();
    }
    let mut deep = src.join("deep");
    for level in 0..64 {
        deep = deep.join(format!("l{level:02}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom.txt"), b"64 levels down").unwrap();
    let long = "n".repeat(251) + ".bin";
    std::fs::write(src.join(&long), pseudo_random(100_000, 9)).unwrap();
    let long_dir = src.join("d".repeat(255));
    std::fs::create_dir_all(&long_dir).unwrap();
    std::fs::write(long_dir.join(&long), b"under a long name").unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::fs::create_dir_all(src.join("empty-dir")).unwrap();
    std::os::unix::fs::symlink("wide/00042", src.join("relative")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("absolute")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", src.join("dangling")).unwrap();
    std::os::unix::fs::symlink("deep", src.join("to-dir")).unwrap();
    let sparse = (backend() == (false, false)).then(|| {
        let path = src.join("sparse-100g.bin");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(100 << 30).unwrap();
        // A few bytes at the very end, past every 32-bit offset.
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"end of a 100 GiB file", (100 << 30) - 21)
            .unwrap();
        path
    });

    let server = Server::start();
    let reference = format!("{}/edges/tree", server.addr);
    let pushed = json(&vial_limited_ok(
        &home,
        NOFILE,
        &[
            "push",
            src.to_str().unwrap(),
            &reference,
            "--tag",
            "v1",
            "--json",
        ],
    ));
    let expected_bytes: u64 =
        10_000 * 8 + 14 + 100_000 + 17 + sparse.as_ref().map_or(0, |_| 100 << 30);
    assert_eq!(pushed["bytes"], expected_bytes, "{pushed}");

    // A mount serves the tree, the sparse file's tail included, without fetching its zeros
    // more than once.
    if fuse_available() {
        let mount = Mount::new_limited(&home, &format!("{reference}:v1"), "mnt", &[], NOFILE);
        let m = &mount.path;
        assert_eq!(std::fs::read_dir(m.join("wide")).unwrap().count(), 10_000);
        assert_eq!(
            std::fs::read(m.join("wide/09999")).unwrap(),
            9999u64.to_le_bytes()
        );
        assert_eq!(
            std::fs::read(deep_in(m)).unwrap(),
            b"64 levels down",
            "the file 64 levels down"
        );
        assert_eq!(
            std::fs::read(m.join(&long)).unwrap(),
            pseudo_random(100_000, 9)
        );
        assert_eq!(
            std::fs::read_link(m.join("dangling")).unwrap(),
            Path::new("nowhere/at/all")
        );
        if sparse.is_some() {
            use std::os::unix::fs::FileExt;
            let f = std::fs::File::open(m.join("sparse-100g.bin")).unwrap();
            assert_eq!(f.metadata().unwrap().len(), 100 << 30);
            let mut tail = vec![0u8; 4096];
            f.read_exact_at(&mut tail, (100 << 30) - 4096).unwrap();
            assert_eq!(&tail[4096 - 21..], b"end of a 100 GiB file");
            assert!(tail[..4096 - 21].iter().all(|&b| b == 0));
            let mut middle = vec![1u8; 1 << 20];
            f.read_exact_at(&mut middle, 57 << 30).unwrap();
            assert!(middle.iter().all(|&b| b == 0));
        }
    } else {
        assert!(!require_all(), "FUSE is required for this test");
    }

    // Pulled (without the sparse file, which would write 100 GiB of zeros): `vial pull` takes
    // the whole version, so the tree compared is pushed again without it.
    if let Some(path) = &sparse {
        std::fs::remove_file(path).unwrap();
        vial_limited_ok(
            &home,
            NOFILE,
            &["push", src.to_str().unwrap(), &reference, "--tag", "v2"],
        );
    } else {
        let pinned = format!("{reference}@{}", pushed["digest"].as_str().unwrap());
        vial_limited_ok(&home, NOFILE, &["tag", "set", &pinned, "v2"]);
    }
    let out = work.path().join("pulled");
    let pulled = vial_limited(
        &home,
        NOFILE,
        &["pull", &format!("{reference}:v2"), out.to_str().unwrap()],
    );
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    assert_same_tree(&src, &out);
}

fn deep_in(root: &Path) -> std::path::PathBuf {
    let mut p = root.join("deep");
    for level in 0..64 {
        p = p.join(format!("l{level:02}"));
    }
    p.join("bottom.txt")
}
