//! A disk that fills up under a download: `vial pull` into a small filesystem gives a clear error,
//! and a mount whose node cache sits on one evicts and serves the right bytes. Neither panics or
//! leaves anything half-written that a later run would trust: once there is room again, the same
//! command finishes with every byte right.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::mount::{fuse_available, Mount};
use crate::support::oci::pseudo_random;
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{require_all, Server};

/// A tmpfs of a given size, mounted on a directory of its own; unmounted when dropped.
struct SmallDisk {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` where this process may not mount (not root): a skip, or a failure under
    /// VIAL_TEST_REQUIRE_ALL=1.
    fn new(mib: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            assert!(
                !require_all(),
                "mounting a small tmpfs (as root) is required (VIAL_TEST_REQUIRE_ALL=1) but failed"
            );
            eprintln!("SKIP: cannot mount a tmpfs here");
            return None;
        }
        Some(SmallDisk { path, _dir: dir })
    }

    /// Gives the filesystem `mib` MiB in all, keeping what is on it.
    fn grow(&self, mib: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success(), "remount {}", self.path.display());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Three files, 40 MiB in all, pushed as `weights/<name>:v1`; returns the source directory.
fn push_checkpoint(server: &Server, home: &Path, name: &str) -> PathBuf {
    let src = home.join("src");
    std::fs::create_dir_all(src.join("shards")).unwrap();
    std::fs::write(src.join("config.json"), br#"{"layers": 2}"#).unwrap();
    std::fs::write(
        src.join("shards/a.bin"),
        pseudo_random(12 << 20, 0xd15c_0001),
    )
    .unwrap();
    std::fs::write(
        src.join("shards/b.bin"),
        pseudo_random(28 << 20, 0xd15c_0002),
    )
    .unwrap();
    push_json(
        home,
        &src,
        &format!("{}/weights/{name}", server.addr),
        &["--tag", "v1"],
    );
    src
}

/// Every file under `root`, relative, in order.
fn files_under(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

#[test]
fn a_pull_that_fills_the_disk_fails_clearly_and_a_later_pull_finishes_right() {
    let Some(disk) = SmallDisk::new(16) else {
        return;
    };
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let src = push_checkpoint(&server, home, "full-pull");
    let reference = format!("{}/weights/full-pull:v1", server.addr);
    let out = disk.path.join("model");

    let failed = vial(home, &["pull", &reference, out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert_eq!(
        failed.status.code(),
        Some(1),
        "a full disk is an error, not a crash (101 is a panic): {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("disk full"),
        "the error names the cause: {stderr}"
    );
    // What it left is never a finished file with wrong bytes: each file there is either absent,
    // a part file, or complete and right.
    for name in files_under(&out) {
        if name.ends_with(".vial-part") {
            continue;
        }
        assert_eq!(
            std::fs::read(out.join(&name)).unwrap(),
            std::fs::read(src.join(&name)).unwrap(),
            "{name} was left in place with wrong bytes after the disk filled"
        );
    }

    // With room again, the same pull resumes and finishes, every byte right and no part left.
    disk.grow(96);
    vial_ok(home, &["pull", &reference, out.to_str().unwrap()]);
    assert_same_tree(&src, &out);
}

#[test]
fn a_mount_whose_cache_disk_fills_evicts_and_serves_every_byte_and_a_later_mount_trusts_nothing_torn(
) {
    if !fuse_available() {
        return;
    }
    let Some(disk) = SmallDisk::new(16) else {
        return;
    };
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let src = push_checkpoint(&server, home, "full-cache");
    let reference = format!("{}/weights/full-cache:v1", server.addr);
    let cache = disk.path.join("cache");
    // A cache allowed more than the disk holds: the disk fills before the cache would evict.
    let args = [
        "--cache-dir",
        cache.to_str().unwrap(),
        "--cache-size",
        "1GiB",
    ];

    {
        let m = Mount::new(home, &reference, "mnt", &args);
        // 40 MiB read through a cache on a 16 MiB disk: the full disk makes the cache evict, and
        // every read gets its bytes (a read that failed here would fail a training job).
        for name in ["config.json", "shards/a.bin", "shards/b.bin"] {
            let mut bytes = Vec::new();
            std::fs::File::open(m.path.join(name))
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .unwrap_or_else(|e| {
                    panic!("{name}: a read failed while the cache disk was full: {e}")
                });
            assert!(
                bytes == std::fs::read(src.join(name)).unwrap(),
                "{name}: wrong bytes read while the cache disk was full"
            );
        }
        let stats = m.stats();
        assert!(stats["chunks_fetched"].as_u64().unwrap() > 0, "{stats}");
        assert!(
            stats["evictions"].as_u64().unwrap() > 0,
            "the cache never evicted, so the disk never filled under it: {stats}"
        );
        vial_ok(home, &["umount", m.path.to_str().unwrap()]);
    }

    // A second mount over the same cache, with room now: whatever the full disk cut short is not
    // trusted, and every file reads back whole.
    disk.grow(96);
    let m = Mount::new(home, &reference, "mnt2", &args);
    assert_same_tree(&src, &m.path);
}
