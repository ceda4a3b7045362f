//! Following a tag: the registry's tag watch, `vial pull --follow` and `vial mount --follow`,
//! as real processes against a real registry.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::model::{bert_like, write_safetensors, TensorSpec};
use crate::support::mount::fuse_available;
use crate::support::vial::{assert_same_tree, vial_ok};
use crate::support::{signal, vial_bin, Server};

/// Longest a test waits for a follower to report: a guard against a hang, not a speed claim
/// (docs/performance.md has the measured switch times).
const HANG: Duration = Duration::from_secs(90);

/// A checkpoint in two safetensors shards. Tensors named in `rewritten` get new bytes (seeded by
/// `generation`); returns the bytes of the tensors rewritten.
fn write_checkpoint(dir: &Path, generation: u64, rewritten: &[&str]) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    let mut changed = 0;
    for shard in 0..2u64 {
        let specs: Vec<TensorSpec> = bert_like(4, 10 * shard + 1)
            .into_iter()
            .map(|(name, elements, seed)| {
                let name = format!("s{shard}.{name}");
                if rewritten.contains(&name.as_str()) {
                    changed += 2 * elements as u64;
                    (name, elements, seed + 1_000_000 * generation)
                } else {
                    (name, elements, seed)
                }
            })
            .collect();
        write_safetensors(&dir.join(format!("model-{shard}.safetensors")), &specs);
    }
    std::fs::write(
        dir.join("config.json"),
        format!("{{\"generation\": {generation}}}\n"),
    )
    .unwrap();
    changed
}

/// Rewritten in the second version: about 5% of the checkpoint's bytes, in both shards.
const FIVE_PERCENT: &[&str] = &[
    "s0.layer.1.attention.weight",
    "s1.layer.2.attention.weight",
    "s1.layer.3.attention.weight",
];

fn push(home: &Path, dir: &Path, reference: &str) -> String {
    let out = vial_ok(home, &["push", dir.to_str().unwrap(), reference]);
    out.trim().lines().last().unwrap().to_owned()
}

fn digest_of(pinned: &str) -> String {
    pinned.rsplit_once('@').unwrap().1.to_owned()
}

/// A follower process whose stdout lines (one JSON object each) arrive on a channel.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<serde_json::Value>,
    /// The directory it keeps (`pull --follow`) or the mountpoint (`mount --follow`).
    path: PathBuf,
}

impl Follower {
    fn spawn(home: &Path, args: &[&str], path: &Path, announces: bool) -> Follower {
        let mut child = Command::new(vial_bin())
            .args(args)
            .env("HOME", home)
            .env("XDG_CACHE_HOME", home.join("cache"))
            .env("DOCKER_CONFIG", home.join("docker"))
            .env("VIAL_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                // A foreground mount says it is ready with a plain line.
                let value = match line.strip_prefix("ready ") {
                    Some(r) => serde_json::json!({ "event": "ready", "reference": r }),
                    None => serde_json::from_str(&line)
                        .unwrap_or_else(|_| panic!("not a JSON line: {line:?}")),
                };
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        let f = Follower {
            child,
            lines,
            path: path.to_owned(),
        };
        if announces {
            let ready = f.next_event();
            assert_eq!(ready["event"], "ready", "{ready}");
        }
        f
    }

    fn pull(home: &Path, reference: &str, dir: &Path) -> Follower {
        Follower::spawn(
            home,
            &[
                "pull",
                "--follow",
                reference,
                dir.to_str().unwrap(),
                "--json",
            ],
            dir,
            false,
        )
    }

    fn mount(home: &Path, reference: &str, mountpoint: &Path, extra: &[&str]) -> Follower {
        std::fs::create_dir_all(mountpoint).unwrap();
        let cache = home.join("node-cache");
        let mut args = vec![
            "mount",
            "--follow",
            reference,
            mountpoint.to_str().unwrap(),
            "--foreground",
            "--announce-ready",
            "--json",
            "--cache-dir",
            cache.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Follower::spawn(home, &args, mountpoint, true)
    }

    fn next_event(&self) -> serde_json::Value {
        self.lines
            .recv_timeout(HANG)
            .unwrap_or_else(|_| panic!("{} said nothing for {HANG:?}", self.path.display()))
    }

    /// The next switch, skipping other events.
    fn next_switch(&self) -> serde_json::Value {
        loop {
            let e = self.next_event();
            if e["event"] == "switch" {
                return e;
            }
        }
    }

    fn current(&self) -> PathBuf {
        self.path.join("current")
    }

    /// What `current` names, e.g. `sha256-…`.
    fn current_name(&self) -> String {
        std::fs::read_link(self.current())
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.path.join(".vial-stats")).unwrap()).unwrap()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        signal(self.child.id(), "TERM");
        if crate::support::wait_timeout(&mut self.child, Duration::from_secs(20)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn dir_name(digest: &str) -> String {
    digest.replacen(':', "-", 1)
}

/// A metric of `server`, `None` while `/metrics` does not show it.
fn metric_shown(server: &Server, name: &str) -> Option<u64> {
    let text = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A metric of `server`, which must be shown: one that is missing (renamed, say) fails the test
/// instead of reading as 0.
fn metric(server: &Server, name: &str) -> u64 {
    metric_shown(server, name).unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// Waits until `n` requests wait on tags at the registry (its own gauge says so; the gauge
/// appears with the first watch).
fn wait_for_waiters(server: &Server, n: u64) {
    let deadline = Instant::now() + HANG;
    while metric_shown(server, "vial_tag_watch_waiting").unwrap_or(0) < n {
        assert!(Instant::now() < deadline, "the waiters never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads every file under `dir` to the end through already-open handles.
fn open_all(dir: &Path) -> Vec<(PathBuf, std::fs::File)> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        files.push((
            p.file_name().unwrap().into(),
            std::fs::File::open(&p).unwrap(),
        ));
    }
    files
}

fn assert_handles_read(files: Vec<(PathBuf, std::fs::File)>, expected: &Path) {
    use std::io::Read;
    for (name, mut f) in files {
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).unwrap();
        assert!(
            bytes == std::fs::read(expected.join(&name)).unwrap(),
            "{} opened before the move did not read the old version's bytes",
            name.display()
        );
    }
}

#[test]
fn a_tag_watch_answers_when_the_tag_moves_with_one_read_however_many_wait() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    write_checkpoint(&v1, 0, &[]);
    write_checkpoint(&v2, 1, FIVE_PERCENT);
    let reference = format!("{}/weights/watched:prod", server.addr);
    let d1 = digest_of(&push(home.path(), &v1, &reference));
    let url = |query: &str| format!("{}/v2/weights/watched/_vial/tags/prod{query}", server.url());
    let client = reqwest::blocking::Client::new();

    // Without `since`, or with a `since` the tag is not at, the answer comes at once.
    let now: serde_json::Value = client.get(url("")).send().unwrap().json().unwrap();
    assert_eq!(now["digest"], d1.as_str());
    let other = "sha256:".to_owned() + &"0".repeat(64);
    let started = Instant::now();
    let r = client
        .get(url(&format!("?since={other}&wait=30")))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["docker-content-digest"], d1.as_str());
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "a watch whose since differs waited for its timeout"
    );
    // A short wait with nothing moving answers the current digest at its end.
    let r: serde_json::Value = client
        .get(url(&format!("?since={d1}&wait=0.2")))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(r["digest"], d1.as_str());
    // Bad input gets an OCI error, not a dropped connection.
    let bad = client.get(url("?since=sha256:nope")).send().unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().unwrap().contains("DIGEST_INVALID"));
    let bad = client
        .get(url(&format!("?since={d1}&wait=soon")))
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    // The plain-OCI way to follow: a manifest GET with the ETag already seen answers 304.
    let manifest = format!("{}/v2/weights/watched/manifests/prod", server.url());
    let unchanged = client
        .get(&manifest)
        .header("if-none-match", format!("\"{d1}\""))
        .send()
        .unwrap();
    assert_eq!(unchanged.status(), 304);
    assert_eq!(unchanged.headers()["docker-content-digest"], d1.as_str());
    assert!(unchanged.bytes().unwrap().is_empty());
    let missing = client
        .get(format!(
            "{}/v2/weights/watched/_vial/tags/absent",
            server.url()
        ))
        .send()
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert!(missing.text().unwrap().contains("MANIFEST_UNKNOWN"));

    // Eight clients wait on the tag; one move answers all of them with one read of the tag.
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let url = url(&format!("?since={d1}&wait=60"));
            std::thread::spawn(move || {
                let r = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(120))
                    .build()
                    .unwrap()
                    .get(url)
                    .send()
                    .unwrap();
                (r.status().as_u16(), r.text().unwrap())
            })
        })
        .collect();
    wait_for_waiters(&server, 8);
    let reads_before = metric(&server, "vial_tag_watch_reads_total");
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    for w in waiters {
        let (status, body) = w.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(&d2), "a waiter was answered {body}, not {d2}");
    }
    assert_eq!(
        metric(&server, "vial_tag_watch_reads_total") - reads_before,
        1,
        "one move, one read of the tag, however many wait"
    );

    // A waiter on a tag that is removed gets 404; one waiting for it to exist gets the digest.
    let removed = {
        let url = url(&format!("?since={d2}&wait=60"));
        std::thread::spawn(move || reqwest::blocking::get(url).unwrap().status().as_u16())
    };
    wait_for_waiters(&server, 1);
    vial_ok(home.path(), &["tag", "rm", &reference]);
    assert_eq!(removed.join().unwrap(), 404);
    let back = {
        let url = url("?since=absent&wait=60");
        std::thread::spawn(move || reqwest::blocking::get(url).unwrap().text().unwrap())
    };
    wait_for_waiters(&server, 1);
    let pinned1 = format!("{}/weights/watched@{d1}", server.addr);
    vial_ok(home.path(), &["tag", "set", &pinned1, "prod"]);
    assert!(back.join().unwrap().contains(&d1));
}

#[test]
fn five_followers_switch_to_a_moved_tag_fetching_only_what_changed() {
    let mounts = fuse_available();
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    write_checkpoint(&v1, 0, &[]);
    let changed = write_checkpoint(&v2, 1, FIVE_PERCENT);
    let total: u64 = ["model-0.safetensors", "model-1.safetensors"]
        .iter()
        .map(|f| std::fs::metadata(v2.join(f)).unwrap().len())
        .sum();
    assert!(changed * 100 / total <= 6, "{changed} of {total} changed");
    let reference = format!("{}/weights/followed:prod", server.addr);
    let d1 = digest_of(&push(home.path(), &v1, &reference));

    let pulls: Vec<Follower> = (0..3)
        .map(|i| {
            let h = home.path().join(format!("pull-{i}"));
            Follower::pull(&h, &reference, &h.join("model"))
        })
        .collect();
    for f in &pulls {
        let first = f.next_switch();
        assert_eq!(first["digest"], d1.as_str());
        assert_same_tree(&f.current(), &v1);
    }
    let mounted: Vec<Follower> = if mounts {
        (0..2)
            .map(|i| {
                let h = home.path().join(format!("mount-{i}"));
                Follower::mount(&h, &reference, &h.join("mnt"), &[])
            })
            .collect()
    } else {
        Vec::new()
    };
    for m in &mounted {
        assert_eq!(m.current_name(), dir_name(&d1));
        // Read once, so the node cache holds the first version.
        assert_same_tree(&m.current(), &v1);
    }
    // Readers that opened every file of the first version before the move, through `current`.
    let old_readers: Vec<_> = pulls
        .iter()
        .chain(&mounted)
        .map(|f| open_all(&f.current()))
        .collect();
    let fetched_before: Vec<u64> = mounted
        .iter()
        .map(|m| m.stats()["bytes_fetched"].as_u64().unwrap())
        .collect();

    let sent_before = metric(&server, "vial_bytes_sent_total");
    let pushed = Instant::now();
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    let pushed_at = pushed.elapsed();
    for f in &pulls {
        let s = f.next_switch();
        eprintln!(
            "pull follower switched {:.2} s after the push ended",
            pushed.elapsed().saturating_sub(pushed_at).as_secs_f64()
        );
        assert_eq!(s["digest"], d2.as_str());
        assert_eq!(s["previous"], d1.as_str());
        let fetched = s["bytes_fetched"].as_u64().unwrap();
        assert!(
            fetched * 10 <= changed * 11,
            "a pull follower fetched {fetched} bytes for {changed} changed"
        );
        assert!(s["bytes_reused"].as_u64().unwrap() > 0);
        assert_same_tree(&f.current(), &v2);
        // The old version is still there beside it (--keep 2).
        assert_same_tree(&f.path.join("versions").join(dir_name(&d1)), &v1);
    }
    for (m, before) in mounted.iter().zip(&fetched_before) {
        let s = m.next_switch();
        assert_eq!(s["digest"], d2.as_str());
        assert_eq!(m.current_name(), dir_name(&d2));
        assert_same_tree(&m.current(), &v2);
        let fetched = m.stats()["bytes_fetched"].as_u64().unwrap() - before;
        assert!(
            fetched * 10 <= changed * 11,
            "a mount follower fetched {fetched} bytes reading the new version, {changed} changed"
        );
        // The old version's directory is still shown while files of it are open.
        assert!(m.path.join(dir_name(&d1)).is_dir());
    }
    for readers in old_readers {
        assert_handles_read(readers, &v1);
    }
    // Every blob byte the registry sent for the move, chunks and the new version's metadata
    // blobs together, stays within 1.1x the changed bytes per follower.
    let followers = (pulls.len() + mounted.len()) as u64;
    let sent = metric(&server, "vial_bytes_sent_total") - sent_before;
    eprintln!("the registry sent {sent} bytes to {followers} followers; {changed} changed");
    assert!(
        sent * 10 <= followers * changed * 11,
        "the registry sent {sent} bytes to {followers} followers for {changed} changed"
    );
}

#[test]
fn a_pull_follower_killed_mid_switch_resumes_and_current_is_never_partial() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    write_checkpoint(&v1, 0, &[]);
    // Everything rewritten: the switch takes long enough to be cut off inside.
    let all: Vec<String> = (0..2)
        .flat_map(|s| {
            bert_like(4, 0)
                .into_iter()
                .map(move |(n, _, _)| format!("s{s}.{n}"))
        })
        .collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    write_checkpoint(&v2, 1, &all);
    let reference = format!("{}/weights/killed:prod", server.addr);
    let d1 = digest_of(&push(home.path(), &v1, &reference));
    let dir = home.path().join("follow");
    let f = Follower::pull(home.path(), &reference, &dir);
    assert_eq!(f.next_switch()["digest"], d1.as_str());

    // Watches `current` the whole time: it names v1 or v2, always complete.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let (dir, v1, v2, stop) = (dir.clone(), v1.clone(), v2.clone(), stop.clone());
        std::thread::spawn(move || {
            let sizes = |d: &Path| {
                let mut v: Vec<(String, u64)> = std::fs::read_dir(d)
                    .unwrap()
                    .map(|e| {
                        let e = e.unwrap();
                        (
                            e.file_name().to_string_lossy().into_owned(),
                            e.metadata().unwrap().len(),
                        )
                    })
                    .collect();
                v.sort();
                v
            };
            let (s1, s2) = (sizes(&v1), sizes(&v2));
            let mut checks = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let now = sizes(&dir.join("current"));
                assert!(
                    now == s1 || now == s2,
                    "current named a partial version: {now:?}"
                );
                checks += 1;
            }
            checks
        })
    };
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    // Cut the follower off as soon as it is building the new version.
    let incoming = dir
        .join("versions")
        .join(format!(".incoming-{}", dir_name(&d2)));
    let deadline = Instant::now() + HANG;
    while !incoming.exists() {
        assert!(Instant::now() < deadline, "the switch never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut f = f;
    let _ = f.child.kill();
    let _ = f.child.wait();
    assert_eq!(
        std::fs::read_link(dir.join("current"))
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy(),
        dir_name(&d1),
        "killed mid-switch, current must still be the old version"
    );
    let again = Follower::pull(home.path(), &reference, &dir);
    let s = again.next_switch();
    assert_eq!(s["digest"], d2.as_str());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let checks = checker.join().unwrap();
    assert!(checks > 10, "current was checked only {checks} times");
    assert_same_tree(&again.current(), &v2);
    assert!(
        !incoming.exists(),
        "the built version was not moved into place"
    );
}

#[test]
fn followers_go_back_without_fetching_survive_a_removed_tag_and_a_registry_restart() {
    let mounts = fuse_available();
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_on(&data.path().join("data"), &[]);
    let addr = server.addr.clone();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2, v3) = (
        home.path().join("v1"),
        home.path().join("v2"),
        home.path().join("v3"),
    );
    write_checkpoint(&v1, 0, &[]);
    write_checkpoint(&v2, 1, FIVE_PERCENT);
    write_checkpoint(&v3, 2, FIVE_PERCENT);
    let reference = format!("{addr}/weights/rolling:prod");
    let pinned1 = push(home.path(), &v1, &reference);
    let d1 = digest_of(&pinned1);
    let pull = Follower::pull(
        &home.path().join("p"),
        &reference,
        &home.path().join("p/model"),
    );
    assert_eq!(pull.next_switch()["digest"], d1.as_str());
    let mount = mounts.then(|| {
        Follower::mount(
            &home.path().join("m"),
            &reference,
            &home.path().join("m/mnt"),
            &[],
        )
    });
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    assert_eq!(pull.next_switch()["digest"], d2.as_str());
    if let Some(m) = &mount {
        assert_eq!(m.next_switch()["digest"], d2.as_str());
    }

    // Back to a version both still have: nothing fetched.
    vial_ok(home.path(), &["tag", "set", &pinned1, "prod"]);
    let back = pull.next_switch();
    assert_eq!(back["digest"], d1.as_str());
    assert_eq!(back["was_kept"], true);
    assert_eq!(back["bytes_fetched"], 0);
    assert_same_tree(&pull.current(), &v1);
    if let Some(m) = &mount {
        let back = m.next_switch();
        assert_eq!(back["digest"], d1.as_str());
        assert_eq!(back["was_kept"], true);
        assert_eq!(back["bytes_fetched"], 0);
        assert_same_tree(&m.current(), &v1);
    }

    // The tag removed: both say so and keep what they have.
    vial_ok(home.path(), &["tag", "rm", &reference]);
    for f in std::iter::once(&pull).chain(mount.as_ref()) {
        let e = f.next_event();
        assert_eq!(e["event"], "tag-removed", "{e}");
        assert_same_tree(&f.current(), &v1);
    }

    // The registry restarts on the same address while they wait; the tag comes back with a new
    // version, and both catch it.
    drop(server);
    let server = Server::start_on(&data.path().join("data"), &["--addr", &addr]);
    let d3 = digest_of(&push(home.path(), &v3, &reference));
    for f in std::iter::once(&pull).chain(mount.as_ref()) {
        let s = f.next_switch();
        assert_eq!(s["digest"], d3.as_str());
        assert_same_tree(&f.current(), &v3);
    }
    // --keep 2: the pull follower holds the current version and the one before it.
    let mut kept: Vec<String> = std::fs::read_dir(home.path().join("p/model/versions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    let mut expected = vec![dir_name(&d1), dir_name(&d3)];
    expected.sort();
    assert_eq!(kept, expected);
    drop(server);
}

#[test]
fn a_following_mount_drops_old_versions_once_closed_and_past_the_grace_time() {
    if !fuse_available() {
        return;
    }
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2, v3) = (
        home.path().join("v1"),
        home.path().join("v2"),
        home.path().join("v3"),
    );
    write_checkpoint(&v1, 0, &[]);
    write_checkpoint(&v2, 1, FIVE_PERCENT);
    write_checkpoint(&v3, 2, FIVE_PERCENT);
    let reference = format!("{}/weights/dropped:prod", server.addr);
    let d1 = digest_of(&push(home.path(), &v1, &reference));
    let m = Follower::mount(
        home.path(),
        &reference,
        &home.path().join("mnt"),
        &["--follow-grace", "1s"],
    );
    let open = std::fs::File::open(m.current().join("config.json")).unwrap();
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    assert_eq!(m.next_switch()["digest"], d2.as_str());
    let old = m.path.join(dir_name(&d1));
    // Open, it stays past the grace time. What shows that the mount looked at it past its grace
    // time: v2, retired after it and with nothing open, is dropped. The pass that drops v2 finds
    // v1 past its grace time too, so only the open file can have kept it.
    let d3 = digest_of(&push(home.path(), &v3, &reference));
    assert_eq!(m.next_switch()["digest"], d3.as_str());
    let middle = m.path.join(dir_name(&d2));
    assert!(middle.is_dir(), "a version just retired is still shown");
    let deadline = Instant::now() + HANG;
    while middle.exists() {
        assert!(
            Instant::now() < deadline,
            "a closed version past its grace time was never dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(old.is_dir(), "a version with a file open was dropped");
    drop(open);
    let deadline = Instant::now() + HANG;
    while old.exists() {
        assert!(
            Instant::now() < deadline,
            "a closed old version was never dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_same_tree(&m.current(), &v3);
}

#[test]
fn a_follower_of_a_registry_without_the_tag_watch_polls_and_still_switches() {
    let Some(peer_registry) = crate::support::DockerRegistry::start() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    write_checkpoint(&v1, 0, &[]);
    let changed = write_checkpoint(&v2, 1, FIVE_PERCENT);
    let reference = format!("{}/weights/plain:prod", peer_registry.addr);
    let d1 = digest_of(&push(home.path(), &v1, &reference));
    let f = Follower::pull(home.path(), &reference, &home.path().join("model"));
    assert_eq!(f.next_switch()["digest"], d1.as_str());
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    let s = f.next_switch();
    assert_eq!(s["digest"], d2.as_str());
    assert!(s["bytes_fetched"].as_u64().unwrap() * 10 <= changed * 11);
    assert_same_tree(&f.current(), &v2);
}

#[test]
fn a_follower_reading_through_the_cache_tier_hears_moves_at_the_origin() {
    let origin = Server::start();
    let data = tempfile::tempdir().unwrap();
    // The cache on the backend matrix's stores too, as its origin: it keeps nothing there.
    let cache = Server::start_on(&data.path().join("cache"), &["--upstream", &origin.url()]);
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    write_checkpoint(&v1, 0, &[]);
    write_checkpoint(&v2, 1, FIVE_PERCENT);
    let reference = format!("{}/weights/cached:prod", origin.addr);
    let d1 = digest_of(&push(home.path(), &v1, &reference));
    let mirror = format!("{}=http://{}", origin.addr, cache.addr);
    let dir = home.path().join("model");
    let f = Follower::spawn(
        home.path(),
        &[
            "pull",
            "--follow",
            &reference,
            dir.to_str().unwrap(),
            "--json",
            "--mirror",
            &mirror,
        ],
        &dir,
        false,
    );
    assert_eq!(f.next_switch()["digest"], d1.as_str());
    let d2 = digest_of(&push(home.path(), &v2, &reference));
    assert_eq!(f.next_switch()["digest"], d2.as_str());
    assert_same_tree(&f.current(), &v2);
    // The watch went through the cache (which passed it on), not around it.
    let text = reqwest::blocking::get(format!("{}/metrics", cache.url()))
        .unwrap()
        .text()
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("vial_http_requests_total")
                && l.contains("endpoint=\"vial_tag_watch\"")
                && l.contains("status=\"200\"")),
        "the cache answered no tag watch:\n{text}"
    );
    crate::support::assert_no_stores_opened(&cache);
}

/// A follower whose stdout and stderr go to one file (`>log 2>&1`, as a service manager or a
/// newcomer capturing output would) says each switch once: the log line that repeats it for a
/// separate log is left out when the log is the same file.
#[test]
fn a_follower_writing_stdout_and_stderr_to_one_file_says_each_switch_once() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    write_checkpoint(&v1, 0, &[]);
    write_checkpoint(&v2, 1, &["s0.layer.0.ffn.weight"]);
    let reference = format!("{}/weights/once:prod", server.addr);
    push(home.path(), &v1, &reference);
    let log = home.path().join("follow.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(vial_bin())
        .args([
            "pull",
            "--follow",
            &reference,
            home.path().join("follow").to_str().unwrap(),
        ])
        .env("HOME", home.path())
        .env("XDG_CACHE_HOME", home.path().join("cache"))
        .env("DOCKER_CONFIG", home.path().join("docker"))
        .env("VIAL_LOG", "info")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let switches = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("switched to")
            .count()
    };
    let wait = |n: usize| {
        let start = Instant::now();
        while switches() < n {
            assert!(
                start.elapsed() < HANG,
                "no switch {n} in: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait(1);
    push(home.path(), &v2, &reference);
    wait(2);
    // Time for a duplicate to appear, if one were coming.
    std::thread::sleep(Duration::from_millis(500));
    signal(child.id(), "TERM");
    crate::support::wait_timeout(&mut child, Duration::from_secs(20));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(switches(), 2, "{text}");
    assert!(
        text.contains("stopped following"),
        "the log still reaches the file: {text}"
    );
}
