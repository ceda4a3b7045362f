//! Lazy mounts from tests: a mounted volume that unmounts itself.

use std::path::{Path, PathBuf};

use super::peer;
use super::vial::{vial, vial_limited_ok, vial_ok};

/// A mounted volume, unmounted (lazily, so a failed test never leaves a busy mount) when dropped.
pub struct Mount {
    pub path: PathBuf,
    pub home: PathBuf,
}

impl Mount {
    pub fn new(home: &Path, reference: &str, name: &str, extra: &[&str]) -> Mount {
        Mount::start(home, reference, name, extra, None)
    }

    /// A mount whose process may hold at most `nofile` open files.
    pub fn new_limited(
        home: &Path,
        reference: &str,
        name: &str,
        extra: &[&str],
        nofile: u32,
    ) -> Mount {
        Mount::start(home, reference, name, extra, Some(nofile))
    }

    fn start(
        home: &Path,
        reference: &str,
        name: &str,
        extra: &[&str],
        nofile: Option<u32>,
    ) -> Mount {
        let path = home.join(name);
        std::fs::create_dir_all(&path).unwrap();
        let mut args = vec!["mount", reference, path.to_str().unwrap()];
        // The node cache is home/node-cache unless the caller names one.
        let cache = home.join("node-cache");
        if !extra.contains(&"--cache-dir") {
            args.extend(["--cache-dir", cache.to_str().unwrap()]);
        }
        args.extend_from_slice(extra);
        match nofile {
            Some(n) => vial_limited_ok(home, n, &args),
            None => vial_ok(home, &args),
        };
        Mount {
            path,
            home: home.to_owned(),
        }
    }

    pub fn stats(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.path.join(".vial-stats")).unwrap()).unwrap()
    }

    /// Waits until the mount has no fetch under way or decided on (`fetches_in_flight` is 0), so
    /// what the reads so far set off has all arrived or failed.
    pub fn wait_idle(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let stats = self.stats();
            let in_flight = stats["fetches_in_flight"]
                .as_u64()
                .unwrap_or_else(|| panic!("no fetches_in_flight in {stats}"));
            if in_flight == 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "fetches never finished: {stats}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn is_mounted(&self) -> bool {
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(self.path.to_str().unwrap()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.is_mounted() {
            let _ = vial(
                &self.home,
                &["umount", "--lazy", self.path.to_str().unwrap()],
            );
        }
    }
}

/// Whether FUSE mounts work here: fusermount3 on PATH and the /dev/fuse device. Without either,
/// the calling test is skipped, or fails under VIAL_TEST_REQUIRE_ALL=1 (CI), so no mount test can
/// pass in CI by not running.
pub fn fuse_available() -> bool {
    if peer("fusermount3").is_none() {
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        assert!(
            !super::require_all(),
            "/dev/fuse is required (VIAL_TEST_REQUIRE_ALL=1) but missing: FUSE mounts cannot run here"
        );
        eprintln!("SKIP: /dev/fuse missing");
        return false;
    }
    true
}
