//! A registry killed with SIGKILL at a random moment, under concurrent pushes (blobs, manifests,
//! tags, and packs of chunks as `vial push` sends them), restarts with every acknowledged blob,
//! manifest, tag and pack intact and nothing partial visible: a pack's chunks appear all together
//! or not at all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vial_core::{Algorithm, Digest};

use crate::support::{matrix_bucket, oci::pseudo_random, Server};

#[derive(Default)]
struct Ledger {
    /// Blobs the server acknowledged with 201: (repo, digest) → size.
    committed: HashMap<(String, Digest), usize>,
    /// Blobs whose upload was under way when the server died.
    in_flight: HashMap<(String, Digest), usize>,
    /// Manifests acknowledged with 201: (repo, tag, digest, bytes).
    manifests: Vec<(String, String, Digest, Vec<u8>)>,
    /// What each tag may point at: (repo, tag) → its state.
    tags: HashMap<(String, String), TagState>,
    /// Packs acknowledged with 201: their chunks (digest, bytes).
    packs: Vec<Vec<(Digest, Vec<u8>)>>,
    /// Packs whose upload was under way when the server died.
    packs_in_flight: Vec<Vec<(Digest, Vec<u8>)>>,
    /// Answers no request here should get: the server answered, so it was alive, and every
    /// request is valid. A 5xx is not a refusal that left the state as it was: the server may
    /// have committed before it failed, and it failed.
    unexpected: Vec<String>,
}

/// Why a request sequence stopped.
enum Stopped {
    /// No answer: the server died (or the connection did with it).
    NoAnswer,
    /// An answer no live, correct server gives to these valid requests.
    Unexpected(String),
}

impl From<reqwest::Error> for Stopped {
    fn from(_: reqwest::Error) -> Stopped {
        Stopped::NoAnswer
    }
}

/// `Err(Unexpected)` unless `resp` has `status`.
fn expect_status(
    resp: reqwest::blocking::Response,
    status: u16,
    what: &str,
) -> Result<reqwest::blocking::Response, Stopped> {
    if resp.status() == status {
        return Ok(resp);
    }
    let got = resp.status();
    let body = resp.text().unwrap_or_default();
    Err(Stopped::Unexpected(format!(
        "{what}: {got} where {status} was due: {body}"
    )))
}

/// Ends a worker: a sequence the server's death cut short is expected; any other answer is
/// recorded for the test to fail on.
fn stopped(ledger: &Mutex<Ledger>, why: Stopped) {
    if let Stopped::Unexpected(what) = why {
        ledger.lock().unwrap().unexpected.push(what);
    }
}

const PACK_REPO: &str = "crash/packs";

/// Sends packs of a few chunks each, as `vial push` does, until stopped.
fn packer(base: String, seed: u64, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let chunks: Vec<(Digest, Vec<u8>)> = (0..2 + (seed ^ n) % 5)
            .map(|i| {
                let s = seed ^ (n << 8) ^ i ^ 0x7061636b;
                let data = pseudo_random(1 + (s % (700 << 10)) as usize, s);
                (Algorithm::Sha256.digest_bytes(&data), data)
            })
            .collect();
        let list: Vec<(&Digest, usize)> = chunks.iter().map(|(d, b)| (d, b.len())).collect();
        let mut body = serde_json::to_vec(&serde_json::json!({ "chunks": list })).unwrap();
        body.push(b'\n');
        for (_, bytes) in &chunks {
            body.extend_from_slice(bytes);
        }
        let slot = {
            let mut l = ledger.lock().unwrap();
            l.packs_in_flight.push(chunks.clone());
            l.packs_in_flight.len() - 1
        };
        let sent = client
            .post(format!("{base}/v2/{PACK_REPO}/_vial/packs"))
            .header("content-type", "application/vnd.vial.pack.v1")
            .body(body)
            .send()
            .map_err(Stopped::from)
            .and_then(|resp| expect_status(resp, 201, "POST a pack"));
        if let Err(why) = sent {
            return stopped(&ledger, why);
        }
        let mut l = ledger.lock().unwrap();
        let pack = l.packs_in_flight.remove(slot);
        l.packs.push(pack);
    }
}

/// Where a tag may point after a crash.
#[derive(Default)]
struct TagState {
    /// The digest of the last PUT to the tag the server acknowledged (or the tag was seen at).
    acknowledged: Option<Digest>,
    /// PUTs sent after it that got no answer: the server may have committed any of them.
    unanswered: Vec<Digest>,
}

fn pusher(base: String, worker: u64, seed: u64, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let repo = format!("crash/w{worker}");
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let blob_seed = seed ^ (worker << 32) ^ n;
        let size = (blob_seed % (3 << 20)) as usize;
        let data = pseudo_random(size, blob_seed);
        let digest = Algorithm::Sha256.digest_bytes(&data);
        let key = (repo.clone(), digest.clone());
        ledger.lock().unwrap().in_flight.insert(key.clone(), size);
        if let Err(why) = upload_chunked(&client, &base, &repo, &data, &digest, blob_seed) {
            return stopped(&ledger, why);
        }
        {
            let mut l = ledger.lock().unwrap();
            l.in_flight.remove(&key);
            l.committed.insert(key, size);
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": vial_core::media::OCI_MANIFEST,
            "config": {"mediaType": "application/octet-stream", "digest": digest, "size": size},
            "layers": [],
        }))
        .unwrap();
        let tag = format!("t{}", n % 3);
        let d = Algorithm::Sha256.digest_bytes(&manifest);
        let key = (repo.clone(), tag.clone());
        // Recorded before it is sent: from here on the server may move the tag.
        ledger
            .lock()
            .unwrap()
            .tags
            .entry(key.clone())
            .or_default()
            .unanswered
            .push(d.clone());
        // The manifest is valid and its blob acknowledged: 201 is the only answer a live server
        // gives. Anything else leaves the PUT unanswered in the ledger (the tag may have moved)
        // and fails the test.
        let sent = client
            .put(format!("{base}/v2/{repo}/manifests/{tag}"))
            .header("content-type", vial_core::media::OCI_MANIFEST)
            .body(manifest.clone())
            .send()
            .map_err(Stopped::from)
            .and_then(|resp| expect_status(resp, 201, &format!("PUT {repo}:{tag}")));
        if let Err(why) = sent {
            return stopped(&ledger, why);
        }
        let mut l = ledger.lock().unwrap();
        let state = l.tags.get_mut(&key).unwrap();
        state.acknowledged = Some(d.clone());
        state.unanswered.clear();
        l.manifests.push((repo.clone(), tag, d, manifest));
    }
}

/// Uploads with a POST, several PATCHes and a PUT; `Ok` once the server acknowledged the blob.
fn upload_chunked(
    client: &reqwest::blocking::Client,
    base: &str,
    repo: &str,
    data: &[u8],
    digest: &Digest,
    seed: u64,
) -> Result<(), Stopped> {
    let start = client
        .post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .send()?;
    let start = expect_status(start, 202, &format!("POST an upload to {repo}"))?;
    let Some(location) = start
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
    else {
        return Err(Stopped::Unexpected(format!(
            "POST an upload to {repo}: 202 without a Location"
        )));
    };
    let location = format!("{base}{location}");
    let chunk = 256 * 1024 + (seed % 100_000) as usize;
    let mut offset = 0;
    while offset + chunk < data.len() {
        let resp = client
            .patch(&location)
            .header(
                "content-range",
                format!("{}-{}", offset, offset + chunk - 1),
            )
            .body(data[offset..offset + chunk].to_vec())
            .send()?;
        expect_status(resp, 202, &format!("PATCH {offset} of {digest}"))?;
        offset += chunk;
    }
    let resp = client
        .put(format!("{location}?digest={digest}"))
        .body(data[offset..].to_vec())
        .send()?;
    expect_status(resp, 201, &format!("PUT {digest}"))?;
    Ok(())
}

fn verify(server: &Server, ledger: &mut Ledger) {
    let client = reqwest::blocking::Client::new();
    let base = server.url();
    for ((repo, digest), size) in &ledger.committed {
        let resp = client
            .get(format!("{base}/v2/{repo}/blobs/{digest}"))
            .send()
            .unwrap();
        assert_eq!(
            resp.status(),
            200,
            "acknowledged blob {digest} in {repo} was lost"
        );
        let body = resp.bytes().unwrap();
        assert_eq!(body.len(), *size);
        assert_eq!(
            &Algorithm::Sha256.digest_bytes(&body),
            digest,
            "acknowledged blob {digest} is corrupt"
        );
    }
    for (repo, digest) in ledger.in_flight.keys() {
        let resp = client
            .get(format!("{base}/v2/{repo}/blobs/{digest}"))
            .send()
            .unwrap();
        match resp.status().as_u16() {
            404 => {}
            200 => {
                let body = resp.bytes().unwrap();
                assert_eq!(
                    &Algorithm::Sha256.digest_bytes(&body),
                    digest,
                    "partial blob {digest} is visible"
                );
            }
            other => panic!("in-flight blob {digest}: unexpected status {other}"),
        }
    }
    // Every acknowledged pack's chunks are there, whole; an unanswered pack is all or nothing.
    let chunk = |digest: &Digest| -> Option<Vec<u8>> {
        let resp = client
            .get(format!("{base}/v2/{PACK_REPO}/blobs/{digest}"))
            .send()
            .unwrap();
        match resp.status().as_u16() {
            404 => None,
            200 => Some(resp.bytes().unwrap().to_vec()),
            other => panic!("chunk {digest} of a pack: unexpected status {other}"),
        }
    };
    for pack in &ledger.packs {
        for (digest, bytes) in pack {
            let got = chunk(digest);
            assert!(
                got.as_ref() == Some(bytes),
                "chunk {digest} of an acknowledged pack was lost or changed"
            );
        }
    }
    let mut landed = Vec::new();
    for pack in &ledger.packs_in_flight {
        let seen: Vec<bool> = pack
            .iter()
            .map(|(digest, bytes)| match chunk(digest) {
                Some(got) => {
                    assert!(&got == bytes, "chunk {digest} of a pack is corrupt");
                    true
                }
                None => false,
            })
            .collect();
        // A chunk may also be there from an earlier pack (the same bytes): only "some missing,
        // some there" across a pack whose chunks are all new is a torn pack.
        let earlier: std::collections::HashSet<&Digest> =
            ledger.packs.iter().flatten().map(|(d, _)| d).collect();
        let own: Vec<bool> = pack
            .iter()
            .zip(&seen)
            .filter(|((d, _), _)| !earlier.contains(d))
            .map(|(_, s)| *s)
            .collect();
        assert!(
            own.iter().all(|s| *s) || own.iter().all(|s| !*s),
            "a pack is half visible after the crash: {seen:?}"
        );
        // What the restarted server shows is durable now.
        if seen.iter().all(|s| *s) {
            landed.push(pack.clone());
        }
    }
    ledger.packs.extend(landed);
    ledger.packs_in_flight.clear();
    for (repo, _tag, digest, bytes) in &ledger.manifests {
        let resp = client
            .get(format!("{base}/v2/{repo}/manifests/{digest}"))
            .send()
            .unwrap();
        assert_eq!(
            resp.status(),
            200,
            "acknowledged manifest {digest} was lost"
        );
        assert_eq!(resp.bytes().unwrap().as_ref(), bytes.as_slice());
    }
    // Every tag resolves to a manifest whose content matches its digest: the last one a PUT to
    // it was acknowledged with, or one sent after that which never got an answer. A tag nothing
    // was acknowledged for may be missing.
    for worker in 0..4 {
        for t in 0..3 {
            let (repo, tag) = (format!("crash/w{worker}"), format!("t{t}"));
            let state = ledger.tags.entry((repo.clone(), tag.clone())).or_default();
            let resp = client
                .get(format!("{base}/v2/{repo}/manifests/{tag}"))
                .header("accept", vial_core::media::OCI_MANIFEST)
                .send()
                .unwrap();
            if resp.status() == 404 {
                assert_eq!(
                    state.acknowledged, None,
                    "the acknowledged update of {repo}:{tag} was lost"
                );
                state.unanswered.clear();
                continue;
            }
            assert_eq!(resp.status(), 200, "{repo}:{tag}");
            let d = resp.headers()["docker-content-digest"]
                .to_str()
                .unwrap()
                .to_owned();
            let body = resp.bytes().unwrap();
            let digest = Algorithm::Sha256.digest_bytes(&body);
            assert_eq!(digest.as_str(), d);
            assert!(
                state.acknowledged.as_ref() == Some(&digest) || state.unanswered.contains(&digest),
                "{repo}:{tag} is at {digest}, but its last acknowledged update set {:?} (and no \
                 unanswered PUT since set {digest}: {:?})",
                state.acknowledged,
                state.unanswered
            );
            // What the restarted server shows is durable now: the next crash may not undo it.
            state.acknowledged = Some(digest);
            state.unanswered.clear();
        }
    }
    // No stored blob may hold bytes that do not match its name.
    let mut checked = 0;
    if let Some((bucket, prefix)) = matrix_bucket(&server.data) {
        for key in bucket.keys(&format!("{prefix}blobs/sha256/")) {
            let bytes = bucket.object(&key);
            assert_eq!(
                Algorithm::Sha256.digest_bytes(&bytes).hex(),
                key.rsplit('/').next().unwrap(),
                "corrupt blob object {key}"
            );
            checked += 1;
        }
    } else {
        let blobs = server.data.join("blobs/sha256");
        if blobs.exists() {
            for prefix in std::fs::read_dir(&blobs).unwrap() {
                for file in std::fs::read_dir(prefix.unwrap().path()).unwrap() {
                    let path = file.unwrap().path();
                    let bytes = std::fs::read(&path).unwrap();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    assert_eq!(
                        Algorithm::Sha256.digest_bytes(&bytes).hex(),
                        name,
                        "corrupt blob file {}",
                        path.display()
                    );
                    checked += 1;
                }
            }
        }
    }
    let acknowledged: std::collections::HashSet<&Digest> =
        ledger.committed.keys().map(|(_, d)| d).collect();
    assert!(
        checked >= acknowledged.len(),
        "{checked} stored blobs checked, but {} were acknowledged",
        acknowledged.len()
    );
}

#[test]
fn sigkill_during_concurrent_pushes_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("crash test seed {seed}");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    for round in 0..4u64 {
        let server = Server::start_on(&data, &[]);
        verify(&server, &mut ledger.lock().unwrap());
        ledger.lock().unwrap().in_flight.clear();
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers: Vec<_> = (0..4)
            .map(|w| {
                let (base, stop, ledger) = (server.url(), stop.clone(), ledger.clone());
                std::thread::spawn(move || {
                    pusher(base, w, seed.wrapping_add(round * 1000), stop, ledger)
                })
            })
            .collect();
        workers.push({
            let (base, stop, ledger) = (server.url(), stop.clone(), ledger.clone());
            std::thread::spawn(move || packer(base, seed.wrapping_add(round * 77), stop, ledger))
        });
        std::thread::sleep(Duration::from_millis(
            300 + (seed.wrapping_add(round * 7919)) % 900,
        ));
        // On a slow backend or a loaded machine no push may have finished yet: the first crash
        // waits for an acknowledged blob, tag and pack, so the test always checks each (or for
        // an unexpected answer, which fails the test below).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let something_of_each = |l: &Ledger| {
            !l.unexpected.is_empty()
                || !l.committed.is_empty()
                    && !l.packs.is_empty()
                    && l.tags.values().any(|t| t.acknowledged.is_some())
        };
        while round == 0
            && !something_of_each(&ledger.lock().unwrap())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        server.kill_hard();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        let unexpected = std::mem::take(&mut ledger.lock().unwrap().unexpected);
        assert!(
            unexpected.is_empty(),
            "the live server gave answers other than success: {unexpected:#?}"
        );
    }
    let server = Server::start_on(&data, &[]);
    let mut l = ledger.lock().unwrap();
    assert!(
        !l.committed.is_empty(),
        "no push completed: the test exercised nothing"
    );
    assert!(
        l.tags.values().any(|t| t.acknowledged.is_some()),
        "no tag update was acknowledged: the test exercised nothing"
    );
    assert!(
        !l.packs.is_empty(),
        "no pack was acknowledged: the test exercised nothing"
    );
    verify(&server, &mut l);
}
