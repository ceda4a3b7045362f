//! Sync jobs: the registry copies a bucket on a real S3-compatible server, another vial registry,
//! Debian's docker-registry and a Hub-shaped HTTP server into sealed versions, and a sync killed
//! with its registry resumes without copying its finished files again.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::hub::Hub;
use crate::support::oci::pseudo_random;
use crate::support::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{oras_python, run, DockerRegistry, Server};

/// Writes `files` under `root`.
fn write_files(root: &Path, files: &[(&str, Vec<u8>)]) {
    for (path, content) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

/// `vial push` of `files` seals the version `pinned` names, and `vial pull` of `reference` gives
/// the files back.
fn assert_seals_what_push_seals(
    home: &Path,
    dir: &Path,
    server: &Server,
    files: &[(&str, Vec<u8>)],
    pinned: &str,
    reference: &str,
) {
    let local = dir.join("local");
    write_files(&local, files);
    let pushed = push_json(
        home,
        &local,
        &format!("{}/weights/pushed:v1", server.addr),
        &[],
    );
    assert_eq!(
        digest_of(pinned),
        digest_of(pushed["reference"].as_str().unwrap()),
        "a sync seals exactly what vial push seals from the same files"
    );
    let out = dir.join("pulled");
    vial_ok(home, &["pull", reference, out.to_str().unwrap()]);
    assert_same_tree(&local, &out);
}

fn digest_of(pinned: &str) -> &str {
    pinned
        .trim()
        .rsplit_once('@')
        .expect("a pinned reference")
        .1
}

/// `vial sync status --json`, parsed.
fn status(home: &Path, volume: &str, id: &str) -> serde_json::Value {
    serde_json::from_str(&vial_ok(home, &["sync", "status", volume, id, "--json"])).unwrap()
}

/// Polls a job until `done` says so.
fn wait_until(
    home: &Path,
    volume: &str,
    id: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let job = status(home, volume, id);
        if done(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "sync job never got to {what}: {job}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the registry logging to `log` says the attempt running job `id` has stopped: it
/// found its lease gone, or its outcome refused because the job is no longer its own.
fn attempt_ended(log: &Path, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let text = std::fs::read_to_string(log).unwrap();
        if text.lines().any(|l| {
            l.contains(id)
                && (l.contains("job lease was lost to another runner; abandoning this attempt")
                    || l.contains("job was taken over before it finished; outcome dropped"))
        }) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled attempt of {id} never stopped:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_bucket_prefix_syncs_into_the_version_vial_push_seals_from_the_same_files() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let files = vec![
        ("config.json", br#"{"hidden_size": 64}"#.to_vec()),
        ("model.safetensors", pseudo_random(3 << 20, 31)),
        ("tokenizer/vocab.json", b"{\"a\": 1}".to_vec()),
        ("empty.txt", Vec::new()),
    ];
    // s3s-fs keeps a bucket's objects as files: this is the bucket `models`.
    let bucket = s3.bucket_dir("models");
    write_files(&bucket.join("run-1"), &files);
    write_files(
        &bucket.join("run-1"),
        &[("scratch.tmp", b"left out".to_vec())],
    );
    write_files(
        &bucket.join("run-2"),
        &[("other.bin", b"not under the prefix".to_vec())],
    );
    let secret = dir.path().join("s3-secret");
    std::fs::write(&secret, format!("{SECRET_KEY}\n")).unwrap();
    let config = dir.path().join("vial.toml");
    std::fs::write(
        &config,
        format!(
            "[[sync-sources]]\nprefix = \"s3://models\"\nendpoint = \"{}\"\nregion = \"us-east-1\"\naccess-key-id = \"{ACCESS_KEY}\"\nsecret-access-key = \"file:{}\"\n",
            s3.endpoint(),
            secret.display()
        ),
    )
    .unwrap();
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let dest = format!("{}/weights/s3", server.addr);

    // A source the operator did not allow is refused before anything is queued.
    let out = vial(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "s3://elsewhere/x",
            "--dest",
            &format!("{dest}:v1"),
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("may not sync from s3://elsewhere/x"), "{err}");
    let out = vial(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "s3://models/run-1",
            "--dest",
            &format!("{dest}:v1"),
            "--include",
            "[",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad glob"));

    let pinned = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "s3://models/run-1",
            "--dest",
            &format!("{dest}:v1"),
            "--exclude",
            "*.tmp",
            "--wait",
        ],
    );
    // The same files pushed from disk make the same version.
    assert_seals_what_push_seals(
        &home,
        dir.path(),
        &server,
        &files,
        &pinned,
        &format!("{dest}:v1"),
    );

    let jobs: serde_json::Value =
        serde_json::from_str(&vial_ok(&home, &["sync", "ls", &dest, "--json"])).unwrap();
    let job = &jobs[0];
    assert_eq!(job["state"], "done");
    assert_eq!(job["source"], "s3://models/run-1");
    assert_eq!(job["progress"]["files-total"], 4);
    assert_eq!(job["progress"]["files-done"], 4);
    assert_eq!(job["digest"].as_str(), Some(digest_of(&pinned)));

    // A prefix that holds nothing says so instead of sealing an empty version.
    let out = vial(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "s3://models/no-such-run",
            "--dest",
            &format!("{dest}:v2"),
            "--wait",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no file to copy"), "{err}");
}

const ORAS_PUSH: &str = r#"
import os, sys, oras.client
host, target, workdir = sys.argv[1:4]
client = oras.client.OrasClient(hostname=host, insecure=True)
os.chdir(workdir)
client.push(target=target, files=sorted(f for f in os.listdir(".") if os.path.isfile(f)))
"#;

#[test]
fn a_volume_in_another_registry_is_mirrored_digest_unchanged_and_an_artifact_is_sealed() {
    let Some(distribution) = DockerRegistry::start() else {
        return;
    };
    let Some(python) = oras_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let source = Server::start();
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--sync-source", "oci://127.0.0.1"],
    );
    let local = dir.path().join("local");
    write_files(
        &local,
        &[
            ("model.safetensors", pseudo_random(2 << 20, 41)),
            ("config.json", b"{}".to_vec()),
        ],
    );

    // From another vial registry.
    let pushed = push_json(&home, &local, &format!("{}/src/vol:v1", source.addr), &[]);
    let volume = digest_of(pushed["reference"].as_str().unwrap()).to_owned();
    let pinned = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            &format!("oci://{}/src/vol:v1", source.addr),
            "--dest",
            &format!("{}/mirror/vol:v1", server.addr),
            "--wait",
        ],
    );
    assert_eq!(
        digest_of(&pinned),
        volume,
        "a mirrored volume keeps its digest"
    );
    let out = dir.path().join("from-vial");
    vial_ok(&home, &["pull", pinned.trim(), out.to_str().unwrap()]);
    assert_same_tree(&local, &out);

    // From Debian's docker-registry: a volume vial pushed there, and an ORAS artifact.
    vial_ok(
        &home,
        &[
            "push",
            local.to_str().unwrap(),
            &format!("{}/w/vol:v1", distribution.addr),
        ],
    );
    let pinned = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            &format!("oci://{}/w/vol:v1", distribution.addr),
            "--dest",
            &format!("{}/mirror/dist:v1", server.addr),
            "--wait",
        ],
    );
    assert_eq!(digest_of(&pinned), volume);

    run(Command::new(&python)
        .args(["-c", ORAS_PUSH, &distribution.addr])
        .arg(format!("{}/oras/files:v1", distribution.addr))
        .arg(&local));
    let pinned = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            &format!("oci://{}/oras/files:v1", distribution.addr),
            "--dest",
            &format!("{}/mirror/oras:v1", server.addr),
            "--wait",
        ],
    );
    // The artifact is mirrored under the tag; the printed reference is its sealed volume, which
    // reads back as the files, and which the tag also opens.
    let artifact = vial_ok(
        &home,
        &[
            "inspect",
            &format!("{}/mirror/oras:v1", server.addr),
            "--json",
        ],
    );
    let artifact: serde_json::Value = serde_json::from_str(&artifact).unwrap();
    assert_eq!(
        artifact["digest"].as_str(),
        Some(digest_of(&pinned)),
        "{artifact}"
    );
    let out = dir.path().join("from-oras");
    vial_ok(&home, &["pull", pinned.trim(), out.to_str().unwrap()]);
    assert_same_tree(&local, &out);

    // A tag the source lacks fails the job with the reason.
    let out = vial(
        &home,
        &[
            "sync",
            "start",
            "--source",
            &format!("oci://{}/src/vol:nope", source.addr),
            "--dest",
            &format!("{}/mirror/none:v1", server.addr),
            "--wait",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn a_hub_sync_killed_with_its_registry_resumes_without_copying_finished_files() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let files = vec![
        ("config.json", br#"{"architectures": ["Tiny"]}"#.to_vec()),
        (
            "model-00001-of-00003.safetensors",
            pseudo_random(2 << 20, 51),
        ),
        (
            "model-00002-of-00003.safetensors",
            pseudo_random(2 << 20, 52),
        ),
        (
            "model-00003-of-00003.safetensors",
            pseudo_random(1 << 20, 53),
        ),
    ];
    let mut served = files.clone();
    served.push(("README.md", b"# tiny".to_vec()));
    served.push((".gitattributes", b"*.safetensors filter=lfs".to_vec()));
    let hub = Hub::start("acme/tiny", &served);
    // The listing leaves one size out: the registry must ask for it.
    hub.hide_size("config.json");
    let last = "model-00003-of-00003.safetensors";
    hub.hold(last);

    let config = dir.path().join("vial.toml");
    std::fs::write(
        &config,
        format!(
            "[[sync-sources]]\nprefix = \"hf://\"\nendpoint = \"{}\"\ntoken = \"hf_test\"\n",
            hub.endpoint()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    // Short, so the restarted registry takes the job over soon after the kill; long enough that
    // a renewal (every third of it) delayed by a busy CI machine does not lose the lease to the
    // runner's other slot, which would start a third attempt and copy the held file again (seen
    // once on PostgreSQL with 2 s).
    let args = ["--config", config.to_str().unwrap(), "--job-lease", "6s"];
    let server = Server::start_on(&data, &args);
    let volume = format!("{}/weights/tiny", server.addr);
    let id = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "hf://acme/tiny",
            "--dest",
            &format!("{volume}:main"),
            "--exclude",
            "README.md",
            "--exclude",
            ".gitattributes",
        ],
    );
    let id = id.trim().to_owned();
    let job = wait_until(&home, &volume, &id, "three files done", |j| {
        j["progress"]["files-done"] == 3
    });
    assert_eq!(job["state"], "running");
    assert_eq!(job["progress"]["files-total"], 4);
    assert_eq!(job["progress"]["pinned"], crate::support::hub::COMMIT);

    // The registry dies mid-file; the held file comes free only afterwards.
    server.kill_hard();
    hub.release();
    let log = dir.path().join("server.log");
    let server = Server::start_logging(&data, &args, "warn", &log);
    let volume = format!("{}/weights/tiny", server.addr);
    let pinned = vial_ok(&home, &["sync", "status", &volume, &id, "--wait"]);

    let downloads = hub.downloads();
    let job = status(&home, &volume, &id);
    // What the restarted registry logged (warnings and up), for a failure below.
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    for (path, _) in &files[..3] {
        assert_eq!(
            downloads.get(*path),
            Some(&1),
            "{path} was copied again: {downloads:?}\n{logged}"
        );
    }
    assert_eq!(job["state"], "done");
    // Each attempt reads the file no attempt finished at most once: the killed one did and the one
    // that finished did, and an attempt between them that a transient failure ended may have
    // (CI once saw three reads).
    let attempts = job["attempts"].as_u64().unwrap() as usize;
    let reads = downloads.get(last).copied().unwrap_or(0);
    assert!(
        (2..=attempts).contains(&reads),
        "{last} read {reads} times in {attempts} attempts: {downloads:?}\n{logged}"
    );
    assert_eq!(
        downloads.get("README.md"),
        None,
        "excluded files are not read"
    );
    assert_eq!(
        job["progress"]["bytes-read"],
        1 << 20,
        "the last attempt read only the last file"
    );

    // The resumed job sealed what an uninterrupted sync, and a push of the same files, seal.
    let again = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "hf://acme/tiny",
            "--dest",
            &format!("{volume}:again"),
            "--exclude",
            "README.md",
            "--exclude",
            ".gitattributes",
            "--wait",
        ],
    );
    assert_eq!(digest_of(&again), digest_of(&pinned));
    assert_seals_what_push_seals(
        &home,
        dir.path(),
        &server,
        &files,
        &pinned,
        &format!("{volume}:main"),
    );

    // A cancelled sync stops, says who cancelled it, and never moves its tag. It copies every
    // file the Hub lists (six, with no exclusions), so a version it sealed would be a new one.
    let sealed_before = versions(&server, "weights/tiny");
    hub.hold(last);
    let id = vial_ok(
        &home,
        &[
            "sync",
            "start",
            "--source",
            "hf://acme/tiny@main",
            "--dest",
            &format!("{volume}:cancelled"),
        ],
    );
    let id = id.trim().to_owned();
    wait_until(&home, &volume, &id, "its held file", |j| {
        j["progress"]["files-total"] == 6 && j["state"] == "running"
    });
    vial_ok(&home, &["sync", "cancel", &volume, &id]);
    hub.release();
    let job = status(&home, &volume, &id);
    assert_eq!(job["state"], "failed");
    assert!(
        job["error"].as_str().unwrap().contains("cancelled by"),
        "{job}"
    );
    let out = vial(&home, &["sync", "status", &volume, &id, "--wait"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cancelled"));
    // Once the abandoned attempt has stopped (at its next lease renewal, or on finding its outcome
    // fenced off), it has recorded nothing and tagged nothing.
    attempt_ended(&log, &id);
    let job = status(&home, &volume, &id);
    assert_eq!(job["state"], "failed");
    assert!(
        job["error"].as_str().unwrap().contains("cancelled by"),
        "{job}"
    );
    assert!(job["digest"].is_null(), "{job}");
    let tags = vial_ok(&home, &["tag", "ls", &volume]);
    assert!(!tags.contains("cancelled"), "{tags}");
    // Nor sealed a version, tagged or not.
    assert_eq!(versions(&server, "weights/tiny"), sealed_before);
    drop(server);
}

/// The digests of every sealed version of `repo`, tagged or not, newest first.
fn versions(server: &Server, repo: &str) -> Vec<String> {
    let listing: serde_json::Value =
        reqwest::blocking::get(format!("{}/v2/{repo}/_vial/versions", server.url()))
            .unwrap()
            .json()
            .unwrap();
    listing["versions"]
        .as_array()
        .unwrap_or_else(|| panic!("no versions in {listing}"))
        .iter()
        .map(|v| v["digest"].as_str().unwrap().to_owned())
        .collect()
}
