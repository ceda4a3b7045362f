//! The cache tier: `vial serve --upstream` in front of an origin registry (behind a proxy that
//! records, and can corrupt, every blob download the cache makes), read by `vial pull`,
//! `vial mount` and skopeo.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::mount::{fuse_available, Mount};
use crate::support::oci::{self, pseudo_random};
use crate::support::proxy::{Fault, Proxy};
use crate::support::vial::{assert_same_tree, login, push_json, vial, vial_ok};
use crate::support::{metric, peer, run, Server};

mod replicas;

/// An origin with one volume, a recording proxy in front of it, and a cache of the proxy.
struct Tier {
    /// `None` once the test has stopped it.
    origin: Option<Server>,
    proxy: Proxy,
    cache: Option<Server>,
    home: tempfile::TempDir,
    src: PathBuf,
    /// `weights/m@sha256:…` of the pushed version.
    pinned: String,
}

impl Tier {
    fn start(cache_args: &[&str]) -> Tier {
        let origin = Server::start();
        let proxy = Proxy::start(&origin.addr);
        let home = tempfile::tempdir().unwrap();
        let src = home.path().join("src");
        std::fs::create_dir_all(src.join("shards")).unwrap();
        std::fs::write(src.join("shards/a.bin"), pseudo_random(6 << 20, 1)).unwrap();
        std::fs::write(src.join("shards/b.bin"), pseudo_random(5 << 20, 2)).unwrap();
        std::fs::write(src.join("config.json"), br#"{"layers": 2}"#).unwrap();
        let pushed = push_json(
            home.path(),
            &src,
            &format!("{}/weights/m", origin.addr),
            &["--tag", "v1"],
        );
        let reference = pushed["reference"].as_str().unwrap();
        let pinned = reference.split_once('/').unwrap().1.to_owned();
        let cache = start_cache(&home.path().join("cache-data"), &proxy.addr, cache_args);
        proxy.take_answered();
        Tier {
            origin: Some(origin),
            proxy,
            cache: Some(cache),
            home,
            src,
            pinned,
        }
    }

    fn origin(&self) -> &Server {
        self.origin.as_ref().expect("the origin is running")
    }

    fn cache(&self) -> &Server {
        self.cache.as_ref().expect("the cache is running")
    }

    /// Stops the cache with SIGTERM and starts it again on the same directory.
    fn restart_cache(&mut self) {
        let old = self.cache.take().unwrap();
        let data = old.data.clone();
        assert!(old.stop().success());
        self.cache = Some(start_cache(&data, &self.proxy.addr, &[]));
    }

    fn pull(&self, reference: &str, into: &str) -> std::process::Output {
        let dir = self.home.path().join(into);
        vial(
            self.home.path(),
            &[
                "pull",
                &format!("{}/{reference}", self.cache().addr),
                dir.to_str().unwrap(),
            ],
        )
    }

    fn pull_ok(&self, reference: &str, into: &str) -> PathBuf {
        let out = self.pull(reference, into);
        assert!(
            out.status.success(),
            "pull of {reference} through the cache: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.home.path().join(into)
    }

    /// How many times the cache asked the upstream for each digest since the last call.
    fn upstream_asks(&self) -> HashMap<String, usize> {
        let mut asks = HashMap::new();
        for get in self.proxy.take_answered() {
            for d in get.digests {
                *asks.entry(d).or_default() += 1;
            }
        }
        asks
    }
}

fn cache_args(upstream: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--upstream".to_owned(), format!("http://{upstream}")];
    if !extra.contains(&"--tag-ttl") {
        args.extend(["--tag-ttl".to_owned(), "1s".to_owned()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A cache of `upstream` on `data`, given the metadata and blob stores the backend matrix picks,
/// as its origin is: a cache keeps its blobs in its cache directory and must not open them
/// ([`crate::support::assert_no_stores_opened`]).
fn start_cache(data: &Path, upstream: &str, extra: &[&str]) -> Server {
    let args = cache_args(upstream, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_on(data, &args)
}

/// A cache replica like [`start_cache`], its log (warnings and worse) kept in [`replica_log`].
fn start_replica(data: &Path, upstream: &str, extra: &[&str]) -> Server {
    let args = cache_args(upstream, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_logging(data, &args, "warn", &data.with_extension("log"))
}

/// What a replica started with [`start_replica`] has logged.
fn replica_log(replica: &Server) -> String {
    std::fs::read_to_string(replica.data.with_extension("log")).unwrap_or_default()
}

/// Whether `log` says its replica asked the peer at `url` for blobs and got no answer.
fn skipped_peer(log: &str, url: &str) -> bool {
    let peer = format!("peer={url}");
    log.lines().any(|l| {
        l.contains("peer cache did not answer") && l.split_whitespace().any(|field| field == peer)
    })
}

/// The replica (an index into `peers`, their URLs as given to `--peers`) that owns `digest`:
/// rendezvous hashing as registry/src/cache/peers.rs does it, the highest first 64 bits of
/// sha256(url, "\n", digest). The tests choose their victims with it and then check in the
/// replicas' logs that the victim was asked, so a registry that picks owners otherwise fails them.
fn owner(peers: &[String], digest: &str) -> usize {
    let score = |url: &String| {
        let d = vial_core::Algorithm::Sha256.digest_bytes(format!("{url}\n{digest}").as_bytes());
        u64::from_str_radix(&d.hex()[..16], 16).unwrap()
    };
    (0..peers.len()).max_by_key(|&i| score(&peers[i])).unwrap()
}

/// The replica that owns the most of `chunks`, and how many it owns.
fn busiest_owner(peers: &[String], chunks: &[(String, u64)]) -> (usize, usize) {
    let mut owned = vec![0; peers.len()];
    for (digest, _) in chunks {
        owned[owner(peers, digest)] += 1;
    }
    let busiest = (0..peers.len()).max_by_key(|&i| owned[i]).unwrap();
    (busiest, owned[busiest])
}

fn volume_bytes(src: &Path) -> u64 {
    ["shards/a.bin", "shards/b.bin", "config.json"]
        .iter()
        .map(|f| std::fs::metadata(src.join(f)).unwrap().len())
        .sum()
}

#[test]
fn a_fleet_pulls_through_the_cache_and_the_origin_sends_each_chunk_once() {
    // A TTL longer than the test: the tag is asked of the upstream once.
    let tier = Tier::start(&["--tag-ttl", "10m"]);
    // Eight nodes start at the same moment.
    std::thread::scope(|s| {
        for n in 0..8 {
            let tier = &tier;
            s.spawn(move || {
                let out = tier.pull_ok("weights/m:v1", &format!("node-{n}"));
                assert_same_tree(&tier.src, &out);
            });
        }
    });
    let asks = tier.upstream_asks();
    let repeated: Vec<_> = asks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "every digest is asked of the upstream once for the whole fleet: {repeated:?}"
    );
    let sent = metric(tier.origin(), "vial_bytes_sent_total");
    let volume = volume_bytes(&tier.src);
    assert!(
        sent >= volume && sent < volume + volume / 20,
        "the origin sent {sent} bytes for a {volume}-byte volume read by 8 nodes"
    );
    let (hits, joins, misses) = (
        metric(tier.cache(), "vial_cache_hits_total"),
        metric(tier.cache(), "vial_cache_single_flight_joins_total"),
        metric(tier.cache(), "vial_cache_misses_total"),
    );
    let index: serde_json::Value = reqwest::blocking::Client::new()
        .get(format!(
            "{}/v2/{}",
            tier.cache().url(),
            tier.pinned.replace('@', "/manifests/")
        ))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let manifests = 1 + index["manifests"].as_array().unwrap().len() as u64;
    let fetched = metric(
        tier.origin(),
        "vial_http_requests_total{endpoint=\"manifest\",method=\"GET\",status=\"200\"}",
    );
    assert!(
        fetched <= manifests,
        "the origin served {fetched} manifest GETs for a version of {manifests} manifests"
    );
    assert!(
        hits + joins > misses,
        "most answers came from the cache's disk or a fill in progress: {hits} hits, {joins} joins, {misses} misses"
    );

    // A mount reads through the cache too, every chunk from its disk now.
    if fuse_available() {
        let m = Mount::new(
            tier.home.path(),
            &format!("{}/{}", tier.cache().addr, tier.pinned),
            "mnt",
            &[],
        );
        assert_same_tree(&tier.src, &m.path);
        assert!(
            tier.upstream_asks().is_empty(),
            "the mount's chunks all came from the cache"
        );
    }
    crate::support::assert_no_stores_opened(tier.cache());
}

#[test]
fn the_cache_never_stores_or_serves_bytes_that_do_not_match() {
    let tier = Tier::start(&[]);
    tier.proxy.set(Fault::Corrupt);
    let out = tier.pull("weights/m:v1", "bad");
    assert!(
        !out.status.success(),
        "a pull of corrupted bytes must fail, not succeed with wrong files"
    );
    // Only manifests (which the proxy leaves alone) were kept: no chunk of ~1 MiB.
    let held = metric(tier.cache(), "vial_cache_bytes");
    assert!(
        held < 100_000,
        "the cache kept {held} bytes of corrupted blobs"
    );

    // What the cache itself answers, over HTTP: `vial pull` checks digests on its own, so it
    // cannot tell a cache that sends wrong bytes from one that refuses them. The cache streams a
    // blob as it arrives and checks the digest at its end: it answers 502 when the check failed
    // before the answer began, and otherwise holds back the blob's last byte until the digest
    // matched, cutting the connection when it did not. A whole answer is always the right bytes.
    let (repo, version) = tier.pinned.split_once('@').unwrap();
    let chunks = version_chunks(&tier.cache().url(), None, repo, version);
    assert!(chunks.len() >= 4, "a volume of several chunks: {chunks:?}");
    let client = reqwest::blocking::Client::new();
    let (largest, largest_size) = chunks.iter().max_by_key(|(_, size)| *size).unwrap().clone();
    let r = client
        .get(format!("{}/v2/{repo}/blobs/{largest}", tier.cache().url()))
        .send()
        .unwrap();
    match r.status().as_u16() {
        502 => {}
        200 => {
            let (body, cut) = read_to_cut(r);
            assert!(
                cut && (body.len() as u64) < largest_size,
                "a GET of {largest} ({largest_size} bytes) through a corrupting upstream was \
                 answered 200 with {} bytes and {}",
                body.len(),
                if cut { "a cut" } else { "a clean end" }
            );
        }
        other => panic!("a GET of a corrupted blob was answered {other}, not 502 or a cut 200"),
    }
    // A bulk read of the others: the cache fetches them in one bulk read, in which the proxy
    // flips the middle byte; the chunk holding it is the bad one.
    let rest: Vec<(String, u64)> = chunks.into_iter().filter(|(d, _)| *d != largest).collect();
    let total: u64 = rest.iter().map(|(_, size)| size).sum();
    let mut bad = (0, 0);
    let mut at = 0;
    for (i, (_, size)) in rest.iter().enumerate() {
        if (at..at + size).contains(&(total / 2)) {
            bad = (i, at + size);
        }
        at += size;
    }
    let r = client
        .post(format!("{}/v2/{repo}/_vial/chunks", tier.cache().url()))
        .json(&serde_json::json!({ "digests": rest.iter().map(|(d, _)| d).collect::<Vec<_>>() }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "a bulk read answers before its fills end");
    let (body, cut) = read_to_cut(r);
    assert!(
        cut && (body.len() as u64) < bad.1,
        "a bulk read of {total} bytes, its chunk {} (ending at byte {}) corrupted, ended after {} \
         bytes with {}",
        bad.0,
        bad.1,
        body.len(),
        if cut { "a cut" } else { "a clean end" }
    );
    let mut at = 0;
    for (digest, size) in &rest {
        let Some(bytes) = body.get(at..at + *size as usize) else {
            break;
        };
        assert_eq!(
            vial_core::Algorithm::Sha256.digest_bytes(bytes).as_str(),
            digest,
            "the bulk read handed out a whole chunk with the wrong bytes"
        );
        at += *size as usize;
    }

    // The corrupted blobs were not kept: with the upstream healthy again they are fetched anew.
    tier.proxy.set(Fault::None);
    tier.proxy.take_answered();
    for digest in [&largest, &rest[bad.0].0] {
        let r = client
            .get(format!("{}/v2/{repo}/blobs/{digest}", tier.cache().url()))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        let (body, cut) = read_to_cut(r);
        assert!(!cut, "a healthy fill of {digest} was cut");
        assert_eq!(
            vial_core::Algorithm::Sha256.digest_bytes(&body).as_str(),
            digest
        );
    }
    let asks = tier.upstream_asks();
    assert!(
        asks.contains_key(&largest) && asks.contains_key(&rest[bad.0].0),
        "the blobs that arrived corrupted were asked of the upstream again: {asks:?}"
    );
    let out = tier.pull_ok("weights/m:v1", "good");
    assert_same_tree(&tier.src, &out);
}

/// Reads an answer's body until it ends or the connection is cut: the bytes, and whether it was
/// cut (a body shorter than its `content-length`, or a broken chunked encoding).
fn read_to_cut(mut r: reqwest::blocking::Response) -> (Vec<u8>, bool) {
    use std::io::Read;
    let mut body = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return (body, false),
            Ok(n) => body.extend_from_slice(&buf[..n]),
            Err(_) => return (body, true),
        }
    }
}

/// The chunks (digest, size) of volume version `version` of `repo`, from its manifests at the
/// registry at `base`, with a bearer `token` when it asks for one.
fn version_chunks(
    base: &str,
    token: Option<&str>,
    repo: &str,
    version: &str,
) -> Vec<(String, u64)> {
    let client = reqwest::blocking::Client::new();
    let get = |reference: &str| -> serde_json::Value {
        let mut request = client
            .get(format!("{base}/v2/{repo}/manifests/{reference}"))
            .header("accept", vial_core::media::OCI_INDEX)
            .header("accept", vial_core::media::OCI_MANIFEST);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let r = request.send().unwrap();
        assert_eq!(r.status(), 200, "manifest {reference} of {repo} at {base}");
        r.json().unwrap()
    };
    let index = get(version);
    let mut chunks: Vec<(String, u64)> = Vec::new();
    for m in index["manifests"].as_array().unwrap() {
        if m["artifactType"] == "application/vnd.vial.chunks.v1" {
            let part = get(m["digest"].as_str().unwrap());
            for layer in part["layers"].as_array().unwrap() {
                let chunk = (
                    layer["digest"].as_str().unwrap().to_owned(),
                    layer["size"].as_u64().unwrap(),
                );
                if !chunks.contains(&chunk) {
                    chunks.push(chunk);
                }
            }
        }
    }
    chunks
}

#[test]
fn pinned_versions_and_last_known_tags_survive_the_origin_going_down_and_a_cache_restart() {
    let mut tier = Tier::start(&[]);
    tier.pull_ok("weights/m:v1", "warm");
    assert!(tier.origin.take().unwrap().stop().success());
    std::thread::sleep(std::time::Duration::from_millis(1100)); // past the tag TTL
    let out = tier.pull_ok("weights/m:v1", "stale");
    assert_same_tree(&tier.src, &out);
    assert!(metric(tier.cache(), "vial_cache_stale_answers_total") >= 1);
    let out = tier.pull_ok(&tier.pinned, "pinned");
    assert_same_tree(&tier.src, &out);
    if fuse_available() {
        let m = Mount::new(
            tier.home.path(),
            &format!("{}/{}", tier.cache().addr, tier.pinned),
            "mnt",
            &[],
        );
        assert_same_tree(&tier.src, &m.path);
    }

    // A tag the cache never saw cannot be answered: a clear error, not a hang.
    let out = tier.pull("weights/m:never", "never");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unreachable"), "{err}");

    // Restarted with the origin still down, the cache still knows what it holds and where.
    tier.restart_cache();
    let out = tier.pull_ok(&tier.pinned, "after-restart");
    assert_same_tree(&tier.src, &out);
    let out = tier.pull_ok("weights/m:v1", "tag-after-restart");
    assert_same_tree(&tier.src, &out);
}

#[test]
fn a_blob_is_served_only_under_a_repository_the_upstream_shows_holds_it() {
    let tier = Tier::start(&[]);
    tier.pull_ok("weights/m:v1", "warm");
    // Another repository at the origin, holding other bytes.
    let other = tier.home.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("x.bin"), pseudo_random(1000, 9)).unwrap();
    push_json(
        tier.home.path(),
        &other,
        &format!("{}/secret/other", tier.origin().addr),
        &["--tag", "v1"],
    );
    // A chunk of weights/m, now on the cache's disk, asked for under secret/other.
    let manifest: serde_json::Value = reqwest::blocking::Client::new()
        .get(format!(
            "{}/v2/{}",
            tier.cache().url(),
            tier.pinned.replace('@', "/manifests/")
        ))
        .header("accept", vial_core::media::OCI_INDEX)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let child = manifest["manifests"][0]["digest"].as_str().unwrap();
    let child: serde_json::Value = reqwest::blocking::get(format!(
        "{}/v2/weights/m/manifests/{child}",
        tier.cache().url()
    ))
    .unwrap()
    .json()
    .unwrap();
    let chunk = child["layers"][0]["digest"].as_str().unwrap().to_owned();
    let get = |repo: &str| {
        reqwest::blocking::get(format!("{}/v2/{repo}/blobs/{chunk}", tier.cache().url()))
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(get("weights/m"), 200);
    assert_eq!(
        get("secret/other"),
        404,
        "the upstream does not hold it there"
    );
    assert_eq!(get("secret/other"), 404);
}

#[test]
fn writes_are_refused_with_the_upstream_to_send_them_to() {
    let tier = Tier::start(&[]);
    let out = vial(
        tier.home.path(),
        &[
            "push",
            tier.src.to_str().unwrap(),
            &format!("{}/weights/m", tier.cache().addr),
            "--tag",
            "v2",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("read-only cache") && err.contains(&tier.proxy.addr),
        "{err}"
    );
    let r = reqwest::blocking::Client::new()
        .delete(format!("{}/v2/weights/m/manifests/v1", tier.cache().url()))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    // Reads of vial's extensions go to the upstream.
    let versions = vial_ok(
        tier.home.path(),
        &[
            "versions",
            &format!("{}/weights/m", tier.cache().addr),
            "--json",
        ],
    );
    assert!(
        versions.contains(tier.pinned.split('@').nth(1).unwrap()),
        "{versions}"
    );
    // It has no web UI of its own and says where its content comes from; it is ready with no
    // store behind it.
    for page in ["/", "/ui/"] {
        let r = reqwest::blocking::get(format!("{}{page}", tier.cache().url())).unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().unwrap();
        assert!(
            text.contains("read-through cache") && text.contains(&tier.proxy.addr),
            "{page}: {text}"
        );
    }
    let ready = reqwest::blocking::get(format!("{}/readyz", tier.cache().url())).unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    crate::support::assert_no_stores_opened(tier.cache());
}

#[test]
fn the_cache_stays_within_its_size_and_still_serves_every_byte() {
    let tier = Tier::start(&["--cache-size", "4MiB"]);
    let out = tier.pull_ok("weights/m:v1", "first");
    assert_same_tree(&tier.src, &out);
    let held = metric(tier.cache(), "vial_cache_bytes");
    assert!(
        held <= 4 << 20,
        "the cache holds {held} bytes over its 4 MiB bound"
    );
    assert!(metric(tier.cache(), "vial_cache_evictions_total") > 0);
    let out = tier.pull_ok("weights/m:v1", "second");
    assert_same_tree(&tier.src, &out);
}

#[test]
fn skopeo_copies_an_image_through_the_cache() {
    let Some(skopeo) = peer("skopeo") else { return };
    let tier = Tier::start(&[]);
    let layout = tier.home.path().join("layout");
    let manifest = oci::write_layout(&layout, "v1", &[1 << 20, 70_000], 3);
    run(Command::new(&skopeo).args([
        "--insecure-policy",
        "copy",
        "--dest-tls-verify=false",
        "--preserve-digests",
        &format!("oci:{}:v1", layout.display()),
        &format!("docker://{}/images/app:v1", tier.origin().addr),
    ]));
    let dst = tier.home.path().join("copied");
    run(Command::new(&skopeo).args([
        "--insecure-policy",
        "copy",
        "--src-tls-verify=false",
        "--preserve-digests",
        &format!("docker://{}/images/app:v1", tier.cache().addr),
        &format!("oci:{}:v1", dst.display()),
    ]));
    for entry in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let entry = entry.unwrap();
        let copied = std::fs::read(dst.join("blobs/sha256").join(entry.file_name())).unwrap();
        assert_eq!(copied, std::fs::read(entry.path()).unwrap());
    }
    let raw = run(Command::new(&skopeo).args([
        "inspect",
        "--tls-verify=false",
        "--raw",
        &format!("docker://{}/images/app@{manifest}", tier.cache().addr),
    ]));
    assert_eq!(
        vial_core::Algorithm::Sha256.digest_bytes(raw.as_bytes()),
        manifest
    );
}

#[test]
fn nodes_read_an_origin_reference_through_a_mirror_and_fall_back_when_it_is_gone() {
    let mut tier = Tier::start(&[]);
    let origin = tier.origin().addr.clone();
    let mirror = format!("{origin}=http://{}", tier.cache().addr);
    let pull = |tier: &Tier, into: &str| {
        let dir = tier.home.path().join(into);
        vial_ok(
            tier.home.path(),
            &[
                "pull",
                &format!("{origin}/weights/m:v1"),
                dir.to_str().unwrap(),
                "--mirror",
                &mirror,
            ],
        );
        assert_same_tree(&tier.src, &dir);
    };
    pull(&tier, "via-cache");
    let misses = metric(tier.cache(), "vial_cache_misses_total");
    assert!(misses > 0, "the pull went through the cache");
    let sent = metric(tier.origin(), "vial_bytes_sent_total");
    assert!(
        !tier.upstream_asks().is_empty(),
        "the cache fetched from the origin"
    );

    if fuse_available() {
        let m = Mount::new(
            tier.home.path(),
            &format!("{origin}/{}", tier.pinned),
            "mnt",
            &["--mirror", &mirror],
        );
        assert_same_tree(&tier.src, &m.path);
        assert!(
            metric(tier.cache(), "vial_cache_hits_total") > 0,
            "the mount read through the cache"
        );
        assert_eq!(
            metric(tier.origin(), "vial_bytes_sent_total"),
            sent,
            "the origin sent nothing more"
        );
    }

    // The cache goes away: nodes read from the origin.
    assert!(tier.cache.take().unwrap().stop().success());
    pull(&tier, "via-origin");
    assert!(metric(tier.origin(), "vial_bytes_sent_total") > sent);
}

#[test]
fn a_busy_mirror_is_asked_again_before_the_origin() {
    let tier = Tier::start(&["--tag-ttl", "10m"]);
    let origin = tier.origin().addr.clone();
    let pull = |through: &str, into: &str| {
        let dir = tier.home.path().join(into);
        vial_ok(
            tier.home.path(),
            &[
                "pull",
                &format!("{origin}/{}", tier.pinned),
                dir.to_str().unwrap(),
                "--mirror",
                &format!("{origin}=http://{through}"),
            ],
        );
        assert_same_tree(&tier.src, &dir);
    };
    pull(&tier.cache().addr, "warm");
    let sent = metric(tier.origin(), "vial_bytes_sent_total");
    // The cache answers 503 to a node's first two blob reads, then serves them; or it hangs up
    // on the first, as on a pooled connection it had just closed.
    for (fault, spent) in [
        (Fault::Unavailable(2), Fault::Unavailable(0)),
        (Fault::Hangup(1), Fault::Hangup(0)),
    ] {
        let busy = Proxy::start(&tier.cache().addr);
        busy.set(fault);
        pull(&busy.addr, &format!("through-{fault:?}"));
        assert_eq!(busy.fault(), spent, "{fault:?} was injected");
        assert_eq!(
            metric(tier.origin(), "vial_bytes_sent_total"),
            sent,
            "after {fault:?} the node asked its cache again instead of reading from the origin"
        );
    }
}

/// An htpasswd file of `users` (name, password) and a token key, in `dir`; returns the `[auth]`
/// table's head lines.
fn auth_table(dir: &Path, users: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let htpasswd = dir.join("htpasswd");
    let lines: String = users
        .iter()
        .map(|(u, p)| format!("{u}:{}\n", bcrypt::hash(p, 4).unwrap()))
        .collect();
    std::fs::write(&htpasswd, lines).unwrap();
    let key = dir.join("token.key");
    std::fs::write(&key, pseudo_random(32, 5)).unwrap();
    format!(
        "[auth]\nhtpasswd = \"{}\"\ntoken-key-file = \"{}\"\n",
        htpasswd.display(),
        key.display()
    )
}

#[test]
fn the_cache_signs_in_upstream_and_keeps_each_repository_to_its_readers() {
    let work = tempfile::tempdir().unwrap();
    // The origin: `pusher` may push anything, `cache` may pull anything, nobody else anything.
    let origin_config = work.path().join("origin.toml");
    std::fs::write(
        &origin_config,
        format!(
            "{}\n[[auth.rules]]\nrepositories = \"*\"\nusers = [\"pusher\"]\nactions = [\"pull\", \"push\"]\n\n[[auth.rules]]\nrepositories = \"*\"\nusers = [\"cache\"]\nactions = [\"pull\"]\n",
            auth_table(&work.path().join("origin-auth"), &[("pusher", "push-pw"), ("cache", "cache-pw")])
        ),
    )
    .unwrap();
    let origin = Server::start_on(
        &work.path().join("origin"),
        &["--config", origin_config.to_str().unwrap()],
    );
    let pusher = work.path().join("pusher");
    login(&pusher, &origin.addr, "pusher", "push-pw");
    let mut pushed = Vec::new();
    for (repo, seed) in [("a/model", 11), ("b/secret", 12)] {
        let src = work.path().join(repo.replace('/', "-"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("w.bin"), pseudo_random(3 << 20, seed)).unwrap();
        let out = push_json(
            &pusher,
            &src,
            &format!("{}/{repo}", origin.addr),
            &["--tag", "v1"],
        );
        pushed.push((src, out["reference"].as_str().unwrap().to_owned()));
    }

    // The cache signs in upstream as `cache`, its password from the environment; its own
    // readers: bob may pull a/*, carol b/*, anonymous nothing.
    let cache_config = work.path().join("cache.toml");
    std::fs::write(
        &cache_config,
        format!(
            "{}\n[[auth.rules]]\nrepositories = \"a/*\"\nusers = [\"bob\"]\nactions = [\"pull\"]\n\n[[auth.rules]]\nrepositories = \"b/*\"\nusers = [\"carol\"]\nactions = [\"pull\"]\n\n[upstream]\nurl = \"http://{}\"\nusername = \"cache\"\npassword = \"env:TEST_UPSTREAM_PASSWORD\"\n",
            auth_table(&work.path().join("cache-auth"), &[("bob", "bob-pw"), ("carol", "carol-pw")]),
            origin.addr
        ),
    )
    .unwrap();
    let cache = Server::start_on_with_env(
        &work.path().join("cache"),
        &["--config", cache_config.to_str().unwrap()],
        &[("TEST_UPSTREAM_PASSWORD", "cache-pw".to_owned())],
    );

    // carol reads b/secret through the cache: its chunks are now on the cache's disk.
    let carol = work.path().join("carol");
    login(&carol, &cache.addr, "carol", "carol-pw");
    let digest = pushed[1].1.split_once('@').unwrap().1;
    let out = carol.join("out");
    vial_ok(
        &carol,
        &[
            "pull",
            &format!("{}/b/secret@{digest}", cache.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&pushed[1].0, &out);

    let client = reqwest::blocking::Client::new();
    let token = |user: &str, password: &str, scope: &str| -> String {
        let r = client
            .get(format!("{}/token?scope={scope}", cache.url()))
            .basic_auth(user, Some(password))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json::<serde_json::Value>().unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let chunks: Vec<String> = version_chunks(
        &cache.url(),
        Some(&token("carol", "carol-pw", "repository:b/secret:pull")),
        "b/secret",
        digest,
    )
    .into_iter()
    .map(|(digest, _)| digest)
    .collect();
    assert!(!chunks.is_empty());
    let bob = token("bob", "bob-pw", "repository:a/model:pull");
    for chunk in &chunks {
        let under_a = client
            .get(format!("{}/v2/a/model/blobs/{chunk}", cache.url()))
            .bearer_auth(&bob)
            .send()
            .unwrap();
        assert_eq!(
            under_a.status(),
            404,
            "a chunk cached for b/secret is not readable under a/model"
        );
        let under_b = client
            .get(format!("{}/v2/b/secret/blobs/{chunk}", cache.url()))
            .bearer_auth(&bob)
            .send()
            .unwrap();
        assert_eq!(under_b.status(), 403, "bob may not read b/secret");
        let anonymous = client
            .get(format!("{}/v2/b/secret/blobs/{chunk}", cache.url()))
            .send()
            .unwrap();
        assert_eq!(anonymous.status(), 401);
    }
    // bob reads a/model through the cache with his own sign-in.
    let bob_home = work.path().join("bob");
    login(&bob_home, &cache.addr, "bob", "bob-pw");
    let out = bob_home.join("out");
    vial_ok(
        &bob_home,
        &[
            "pull",
            &format!("{}/a/model:v1", cache.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&pushed[0].0, &out);
    crate::support::assert_no_stores_opened(&cache);
}

#[test]
fn containerd_pulls_an_ordinary_image_through_the_cache_as_a_mirror() {
    let Some(skopeo) = peer("skopeo") else { return };
    let Some(ctd) = crate::support::containerd::Containerd::start() else {
        return;
    };
    let tier = Tier::start(&[]);
    let layout = tier.home.path().join("busybox");
    if crate::support::containerd::busybox_layout(&layout, "1").is_none() {
        return;
    }
    let image = format!("{}/images/busybox:1", tier.origin().addr);
    run(Command::new(&skopeo)
        .args(["--insecure-policy", "copy", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:1", layout.display()))
        .arg(format!("docker://{image}")));
    // docs/cache.md: the origin's hosts.toml names the cache as a mirror for pulls.
    let hosts = tier.home.path().join("certs.d");
    let origin_dir = hosts.join(&tier.origin().addr);
    std::fs::create_dir_all(&origin_dir).unwrap();
    std::fs::write(
        origin_dir.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            tier.origin().addr,
            tier.cache().addr
        ),
    )
    .unwrap();
    ctd.ctr_ok(&[
        "images",
        "pull",
        "--hosts-dir",
        hosts.to_str().unwrap(),
        "--snapshotter",
        "vial",
        &image,
    ]);
    let asks = tier.upstream_asks();
    assert!(
        !asks.is_empty(),
        "the layers came through the cache, which fetched them from the origin"
    );
    assert!(metric(tier.cache(), "vial_cache_misses_total") > 0);
    let out = ctd.ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "vial",
        &image,
        "via-cache",
        "/bin/busybox",
        "echo",
        "pulled through the cache",
    ]);
    assert_eq!(out.trim(), "pulled through the cache");
}
