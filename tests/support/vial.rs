//! Running the `vial` CLI from tests.

use std::path::Path;
use std::process::{Command, Output};

use super::vial_bin;

/// Runs `vial ARGS` with an isolated cache and Docker config, returning its output.
pub fn vial(home: &Path, args: &[&str]) -> Output {
    in_home(Command::new(vial_bin()), home, args)
}

/// Runs `vial ARGS` like [`vial`], with at most `nofile` open files.
pub fn vial_limited(home: &Path, nofile: u32, args: &[&str]) -> Output {
    in_home(super::limited(nofile), home, args)
}

/// Runs `vial ARGS` with at most `nofile` open files, panicking with its stderr if it fails;
/// returns stdout.
pub fn vial_limited_ok(home: &Path, nofile: u32, args: &[&str]) -> String {
    succeeded(vial_limited(home, nofile, args), args)
}

fn in_home(mut command: Command, home: &Path, args: &[&str]) -> Output {
    command
        .args(args)
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("DOCKER_CONFIG", home.join("docker"))
        .env("VIAL_LOG", "warn")
        .output()
        .expect("run vial")
}

/// Runs `vial ARGS`, panicking with its stderr if it fails; returns stdout.
pub fn vial_ok(home: &Path, args: &[&str]) -> String {
    succeeded(vial(home, args), args)
}

fn succeeded(out: Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "vial {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `vial push --json`, parsed.
pub fn push_json(home: &Path, dir: &Path, reference: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["push", dir.to_str().unwrap(), reference, "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&vial_ok(home, &args)).expect("push --json output")
}

/// The SHA-256 of a file's bytes, read in pieces: a herd of readers comparing large trees holds
/// digests, not whole files.
/// Digests are remembered by inode, size and change time, so a tree compared by many readers
/// (the expected side of a herd) is hashed once.
fn content_digest(path: &Path) -> String {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    type Key = (u64, u64, u64, i64, i64, i64, i64);
    static SEEN: std::sync::Mutex<Option<std::collections::HashMap<Key, String>>> =
        std::sync::Mutex::new(None);
    let m = std::fs::metadata(path).unwrap();
    let key = (
        m.dev(),
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    );
    if let Some(d) = SEEN.lock().unwrap().as_ref().and_then(|s| s.get(&key)) {
        return d.clone();
    }
    let mut f = std::fs::File::open(path).unwrap();
    let mut hasher = vial_core::Algorithm::Sha256.hasher();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = hasher.finish().to_string();
    SEEN.lock()
        .unwrap()
        .get_or_insert_with(Default::default)
        .insert(key, digest.clone());
    digest
}

/// Asserts two directory trees are identical: names, types, file bytes, exec bits, symlink targets.
pub fn assert_same_tree(a: &Path, b: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let list = |root: &Path| {
        let mut v = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                if m.is_dir() {
                    stack.push(p.clone());
                    v.push((rel, "dir".to_string(), String::new()));
                } else if m.file_type().is_symlink() {
                    v.push((
                        rel,
                        format!("link {}", std::fs::read_link(&p).unwrap().display()),
                        String::new(),
                    ));
                } else {
                    let exec = m.permissions().mode() & 0o111 != 0;
                    v.push((rel, format!("file exec={exec}"), content_digest(&p)));
                }
            }
        }
        v.sort();
        v
    };
    let (la, lb) = (list(a), list(b));
    assert_eq!(
        la.len(),
        lb.len(),
        "different entry counts: {:?} vs {:?}",
        la.iter().map(|x| &x.0).collect::<Vec<_>>(),
        lb.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    for (x, y) in la.iter().zip(&lb) {
        assert_eq!((&x.0, &x.1), (&y.0, &y.1));
        assert!(x.2 == y.2, "content of {} differs", x.0);
    }
}

/// `vial login HOST -u USER` with the password on stdin, in `home`.
pub fn login(home: &Path, host: &str, user: &str, password: &str) {
    use std::io::Write;
    let mut child = Command::new(vial_bin())
        .args(["login", host, "-u", user, "--password-stdin"])
        .env("HOME", home)
        .env("DOCKER_CONFIG", home.join("docker"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(password.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "vial login {host} -u {user}"
    );
}

/// The holders of leases on a pinned version (`HOST/NAME@DIGEST`), as the registry lists them.
pub fn lease_holders(server: &super::Server, pinned: &str) -> Vec<String> {
    let (name, digest) = pinned.split_once('/').unwrap().1.rsplit_once('@').unwrap();
    let v: serde_json::Value =
        reqwest::blocking::get(format!("{}/v2/{name}/_vial/leases/{digest}", server.url()))
            .unwrap()
            .json()
            .unwrap();
    v["leases"]
        .as_array()
        .unwrap_or_else(|| panic!("no lease list for {pinned}: {v}"))
        .iter()
        .map(|l| l["holder"].as_str().unwrap().to_owned())
        .collect()
}
