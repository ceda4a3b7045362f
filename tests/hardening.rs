//! The front door under attack: each finding of the hostile-input review (issue #15) has a
//! regression test here, named for what it regressed, plus the limits that keep slow and greedy
//! clients from holding the server.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use reqwest::blocking::Client;

use crate::support::oci::pseudo_random;
use crate::support::{push_blob, push_manifest, Server};

const ALICE: (&str, &str) = ("alice", "alice-secret-pw");
const BOB: (&str, &str) = ("bob", "bob-secret-pw");

/// alice may push to team/* and pull everywhere; bob may pull everywhere; anyone may pull public/*.
fn auth_config(dir: &Path) -> std::path::PathBuf {
    let key = dir.join("token.key");
    std::fs::write(&key, pseudo_random(32, 7)).unwrap();
    let path = dir.join("vial.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[auth]
token-key-file = "{key}"

[[auth.users]]
name = "alice"
password-hash = "{alice}"

[[auth.users]]
name = "bob"
password-hash = "{bob}"

[[auth.rules]]
repositories = "team/*"
users = ["alice"]
actions = ["push", "delete"]

[[auth.rules]]
repositories = "*"
users = ["alice", "bob"]
actions = ["pull"]

[[auth.rules]]
repositories = "public/*"
users = ["anonymous"]
actions = ["pull"]
"#,
            key = key.display(),
            alice = bcrypt::hash(ALICE.1, 4).unwrap(),
            bob = bcrypt::hash(BOB.1, 4).unwrap(),
        ),
    )
    .unwrap();
    path
}

fn serve_with_auth(dir: &Path, extra: &[&str]) -> Server {
    let config = auth_config(dir);
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start_on(&dir.join("data"), &args)
}

/// A token for `scope`, as `user` or anonymously.
fn token(c: &Client, base: &str, user: Option<(&str, &str)>, scope: &str) -> String {
    let mut req = c.get(format!("{base}/token?service=vial&scope={scope}"));
    if let Some((u, p)) = user {
        req = req.basic_auth(u, Some(p));
    }
    let r = req.send().unwrap();
    assert_eq!(r.status(), 200, "token for {user:?} {scope}");
    r.json::<serde_json::Value>().unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The `access` claim of a token (its payload is not encrypted, only signed).
fn access(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["access"].clone()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn a_presence_check_with_pull_rights_only_links_nothing_and_creates_no_repository() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_auth(dir.path(), &[]);
    let base = server.url();
    let c = Client::new();
    // alice puts a blob in a team repository.
    let alice_push = token(&c, &base, Some(ALICE), "repository:team/private:pull,push");
    let authed = |t: &str| {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("authorization", bearer(t).parse().unwrap());
        Client::builder().default_headers(h).build().unwrap()
    };
    let secret = push_blob(
        &authed(&alice_push),
        &base,
        "team/private",
        b"private bytes",
    );

    // bob may pull everywhere but push nowhere: he learns nothing is in public/leak, and nothing
    // is linked or created there.
    let present = |client: &Client, repo: &str| {
        let r = client
            .post(format!("{base}/v2/{repo}/_vial/blobs/present"))
            .json(&serde_json::json!({ "digests": [secret] }))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "presence check in {repo}");
        r.json::<serde_json::Value>().unwrap()["present"].clone()
    };
    let bob = token(&c, &base, Some(BOB), "repository:public/leak:pull,push");
    assert_eq!(present(&authed(&bob), "public/leak"), serde_json::json!([]));
    // Anonymous pull on public/*: the same answer, and still nothing created.
    assert_eq!(present(&c, "public/anon"), serde_json::json!([]));
    for repo in ["public/leak", "public/anon"] {
        let r = c
            .get(format!("{base}/v2/{repo}/blobs/{secret}"))
            .send()
            .unwrap();
        assert_eq!(
            r.status(),
            404,
            "the private blob is not readable in {repo}"
        );
        let r = c.get(format!("{base}/v2/{repo}/tags/list")).send().unwrap();
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(
            body["errors"][0]["code"], "NAME_UNKNOWN",
            "{repo} must not have been created"
        );
    }
    // Who may push there and pull everywhere still gets the bulk cross-repository mount.
    let alice = token(&c, &base, Some(ALICE), "repository:team/copy:pull,push");
    assert_eq!(
        present(&authed(&alice), "team/copy"),
        serde_json::json!([secret])
    );
    let r = authed(&alice)
        .head(format!("{base}/v2/team/copy/blobs/{secret}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "linked for a caller who may push there");
}

/// The longest a job status request waits, whatever `?wait=` asks (registry/src/api/vial.rs).
const MAX_JOB_WAIT: Duration = Duration::from_secs(30);

#[test]
fn a_huge_wait_parameter_is_bounded_instead_of_panicking() {
    // Jobs are queued here and never run, so a status request waits as long as it may.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--run-jobs", "false", "--sync-source", "oci://127.0.0.1"],
    );
    let base = server.url();
    let c = Client::new();
    let huge = [
        "1e20",
        "1e308",
        "inf",
        "18446744073709551616",
        "9999999999h",
    ];
    // A duration too long to represent at all is refused (400), not waited on.
    let unrepresentable = "99999999999999999999s";
    // No such job: answered at once, whatever the wait.
    let d = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    for wait in huge.iter().chain(&["-5", unrepresentable]) {
        for path in [
            format!("/v2/w/m/_vial/seal/{d}"),
            "/v2/w/m/_vial/sync/0f0f".to_owned(),
        ] {
            let r = c
                .get(format!("{base}{path}?wait={wait}"))
                .timeout(Duration::from_secs(60))
                .send()
                .unwrap_or_else(|e| panic!("{path}?wait={wait}: no answer: {e}"));
            let status = r.status().as_u16();
            assert!(
                status == 404 || status == 400,
                "{path}?wait={wait}: {status}"
            );
            let body: serde_json::Value = r.json().unwrap();
            assert!(body["errors"][0]["code"].is_string(), "{body}");
        }
    }
    let r = c
        .get(format!("{base}/v2/w/m/_vial/seal/{d}?wait=soon"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400, "a wait that is no number is refused");

    // A seal and a sync that stay queued: a huge wait is held to the cap, then answered with the
    // job as it is; a negative one is no wait at all.
    let blob = push_blob(&c, &base, "w/m", b"config");
    let (manifest, _) = push_manifest(&c, &base, "w/m", "v1", &[(blob, 6)]);
    let r = c
        .post(format!("{base}/v2/w/m/_vial/seal/{manifest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());
    let r = c
        .post(format!("{base}/v2/w/m/_vial/sync"))
        .json(&serde_json::json!({ "source": "oci://127.0.0.1:9/none:v1", "tag": "synced" }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());
    let sync: serde_json::Value = r.json().unwrap();
    let sync = sync["id"].as_str().unwrap().to_owned();
    let paths = [
        format!("/v2/w/m/_vial/seal/{manifest}"),
        format!("/v2/w/m/_vial/sync/{sync}"),
    ];
    for path in &paths {
        let r = c
            .get(format!("{base}{path}?wait={unrepresentable}"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 400, "{path}?wait={unrepresentable}");
    }
    // All at once, so the test waits the cap once.
    let waits: Vec<_> = huge
        .iter()
        .chain(&["-5"])
        .flat_map(|wait| paths.iter().map(move |path| format!("{path}?wait={wait}")))
        .map(|query| {
            let url = format!("{base}{query}");
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let r = Client::new()
                    .get(url)
                    .timeout(MAX_JOB_WAIT * 3)
                    .send()
                    .unwrap_or_else(|e| panic!("{query}: no answer: {e}"));
                let elapsed = started.elapsed();
                assert_eq!(r.status(), 200, "{query}");
                let job: serde_json::Value = r.json().unwrap();
                assert_eq!(job["state"], "queued", "{query}: {job}");
                (query, elapsed)
            })
        })
        .collect();
    for w in waits {
        let (query, elapsed) = w.join().unwrap();
        if query.ends_with("wait=-5") {
            assert!(elapsed < Duration::from_secs(5), "{query}: {elapsed:?}");
        } else {
            // The cap, give or take a loaded machine's delays, and not a moment less.
            assert!(
                elapsed >= MAX_JOB_WAIT && elapsed < MAX_JOB_WAIT + Duration::from_secs(10),
                "{query} answered after {elapsed:?}, not after the {MAX_JOB_WAIT:?} cap"
            );
        }
    }
}

#[test]
fn a_signed_in_user_keeps_what_anonymous_clients_may_pull() {
    // dave's own rules name only dave/*; anonymous clients may pull public/*.
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    std::fs::write(&key, pseudo_random(32, 9)).unwrap();
    let config = dir.path().join("vial.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\ntoken-key-file = \"{}\"\n[[auth.users]]\nname = \"dave\"\npassword-hash = \"{}\"\n\
             [[auth.rules]]\nrepositories = \"dave/*\"\nusers = [\"dave\"]\nactions = [\"pull\", \"push\"]\n\
             [[auth.rules]]\nrepositories = \"public/*\"\nusers = [\"anonymous\"]\nactions = [\"pull\"]\n",
            key.display(),
            bcrypt::hash("dave-pw", 4).unwrap()
        ),
    )
    .unwrap();
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let base = server.url();
    let c = Client::new();
    let pull = serde_json::json!([{"type": "repository", "name": "public/p", "actions": ["pull"]}]);
    assert_eq!(
        access(&token(&c, &base, None, "repository:public/p:pull")),
        pull
    );
    let dave = token(
        &c,
        &base,
        Some(("dave", "dave-pw")),
        "repository:public/p:pull",
    );
    assert_eq!(
        access(&dave),
        pull,
        "signing in must not lose the anonymous pull"
    );
    let r = c
        .get(format!("{base}/v2/public/p/tags/list"))
        .header("authorization", bearer(&dave))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404, "authorized: the repository is only empty");
    // And never more than anonymous clients may do there.
    let push = token(
        &c,
        &base,
        Some(("dave", "dave-pw")),
        "repository:public/p:push",
    );
    assert_eq!(access(&push), serde_json::json!([]));
}

#[test]
fn the_host_header_never_reaches_the_challenge_unescaped() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_auth(dir.path(), &[]);
    // reqwest refuses to send such a Host: speak HTTP by hand.
    let challenge = |addr: &str, host: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET /v2/team/x/tags/list HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        let line = response
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("www-authenticate:"))
            .unwrap_or_else(|| panic!("no challenge in {response}"))
            .to_owned();
        line
    };
    let line = challenge(&server.addr, "evil\", error=\"x");
    assert!(
        line.contains("realm=\"http://localhost/token\""),
        "a Host that is not a host name is not used: {line}"
    );
    assert_eq!(line.matches("error=").count(), 0, "{line}");
    let line = challenge(&server.addr, "registry.internal:5000");
    assert!(
        line.contains("realm=\"http://registry.internal:5000/token\""),
        "{line}"
    );
    drop(server);
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_auth(dir.path(), &["--public-url", "https://models.example.com/"]);
    let line = challenge(&server.addr, "anything.else");
    assert!(
        line.contains("realm=\"https://models.example.com/token\""),
        "public-url decides the realm: {line}"
    );
}

#[test]
fn a_layer_declared_smaller_than_its_blob_is_refused() {
    let server = Server::start();
    let base = server.url();
    let c = Client::new();
    let blob = push_blob(&c, &base, "sizes/m", &pseudo_random(2001, 3));
    let manifest = |size: u64| {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": vial_core::media::OCI_MANIFEST,
            "config": {"mediaType": vial_core::media::OCI_EMPTY, "digest": vial_core::media::OCI_EMPTY_DIGEST, "size": 2},
            "layers": [{"mediaType": "application/octet-stream", "digest": blob, "size": size}],
        })
    };
    push_blob(&c, &base, "sizes/m", b"{}");
    for size in [5, 2000, 2002] {
        let r = c
            .put(format!("{base}/v2/sizes/m/manifests/bad"))
            .header("content-type", vial_core::media::OCI_MANIFEST)
            .body(serde_json::to_vec(&manifest(size)).unwrap())
            .send()
            .unwrap();
        assert_eq!(r.status(), 400, "declared {size} for 2001 bytes");
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(body["errors"][0]["code"], "MANIFEST_INVALID", "{body}");
        assert_eq!(body["errors"][0]["detail"]["actual"], 2001, "{body}");
    }
    let r = c
        .put(format!("{base}/v2/sizes/m/manifests/good"))
        .header("content-type", vial_core::media::OCI_MANIFEST)
        .body(serde_json::to_vec(&manifest(2001)).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    // An index child declared at the wrong size is refused the same way.
    let good = c
        .get(format!("{base}/v2/sizes/m/manifests/good"))
        .header("accept", vial_core::media::OCI_MANIFEST)
        .send()
        .unwrap();
    let digest = good.headers()["docker-content-digest"]
        .to_str()
        .unwrap()
        .to_owned();
    let real_size = good.bytes().unwrap().len();
    let index = |size: usize| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": vial_core::media::OCI_INDEX,
            "manifests": [{"mediaType": vial_core::media::OCI_MANIFEST, "digest": digest, "size": size}],
        }))
        .unwrap()
    };
    let r = c
        .put(format!("{base}/v2/sizes/m/manifests/index"))
        .header("content-type", vial_core::media::OCI_INDEX)
        .body(index(real_size + 1))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .put(format!("{base}/v2/sizes/m/manifests/index"))
        .header("content-type", vial_core::media::OCI_INDEX)
        .body(index(real_size))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[test]
fn a_reference_that_is_neither_tag_nor_digest_names_no_manifest() {
    let server = Server::start();
    let base = server.url();
    let c = Client::new();
    let blob = push_blob(&c, &base, "refs/m", b"abc");
    push_manifest(&c, &base, "refs/m", "v1", &[(blob, 3)]);
    for reference in [".INVALID_MANIFEST_NAME", "sha256:nothex", "a:b"] {
        let r = c
            .head(format!("{base}/v2/refs/m/manifests/{reference}"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 404, "HEAD {reference}");
        let r = c
            .get(format!("{base}/v2/refs/m/manifests/{reference}"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 404, "GET {reference}");
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(body["errors"][0]["code"], "MANIFEST_UNKNOWN");
    }
}

#[test]
fn sparse_indexes_are_accepted_unless_turned_off_but_a_volume_index_must_be_complete() {
    let missing = "sha256:0000000000000000000000000000000000000000000000000000000000000042";
    let index = |artifact_type: Option<&str>| {
        let mut v = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": vial_core::media::OCI_INDEX,
            "manifests": [{"mediaType": vial_core::media::OCI_MANIFEST, "digest": missing, "size": 500,
                           "platform": {"architecture": "arm64", "os": "linux"}}],
        });
        if let Some(t) = artifact_type {
            v["artifactType"] = t.into();
        }
        serde_json::to_vec(&v).unwrap()
    };
    let put = |base: &str, body: Vec<u8>| {
        Client::new()
            .put(format!("{base}/v2/sparse/i/manifests/v1"))
            .header("content-type", vial_core::media::OCI_INDEX)
            .body(body)
            .send()
            .unwrap()
    };
    let server = Server::start();
    let base = server.url();
    let r = put(&base, index(None));
    assert_eq!(r.status(), 201, "{}", r.text().unwrap());
    let r = put(&base, index(Some(vial_core::volume::VOLUME_ARTIFACT_TYPE)));
    assert_eq!(r.status(), 400, "a volume's index is never sparse");
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "MANIFEST_BLOB_UNKNOWN");
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let strict = Server::start_on(&dir.path().join("data"), &["--sparse-indexes", "false"]);
    let r = put(&strict.url(), index(None));
    assert_eq!(r.status(), 400, "refused when turned off");
}

/// Reads from `s` until the server closes the connection; `Ok(n)` bytes, or the read error.
fn read_until_closed(s: &mut TcpStream) -> std::io::Result<usize> {
    let mut total = 0;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(total),
            // A signal meant for another test's child process; the read goes on.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(&dir.path().join("data"), &["--header-timeout", "1s"]);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    // Far longer than the timeout, so only the server's closing can end the read.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(b"GET /v2/ HTTP/1.1\r\nHost: x\r\n").unwrap();
    read_until_closed(&mut s).expect("the server closes the connection, not our read timeout");
    // The server is still fine for everyone else.
    assert_eq!(
        Client::new()
            .get(format!("{}/v2/", server.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
}

/// Starts a chunked upload and returns its location.
fn start_upload(base: &str, repo: &str) -> String {
    let r = Client::new()
        .post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    r.headers()["location"].to_str().unwrap().to_owned()
}

/// Opens a PATCH of `location` with a chunked body and sends its first byte, leaving the body
/// open: a client trickling its upload.
fn open_trickle(addr: &str, location: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PATCH {location} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n"
    )
    .unwrap();
    s
}

#[test]
fn a_body_that_trickles_below_the_minimum_rate_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--body-timeout", "2s", "--min-body-rate", "1000"],
    );
    let location = start_upload(&server.url(), "slow/up");
    let mut s = open_trickle(&server.addr, &location);
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // One byte every 300 ms is never idle for 2 s, but far below 1000 bytes a second: the server
    // must answer (or close) while we keep sending. 200 bytes take a minute; it must not get there.
    let mut answer = Vec::new();
    let cut_off = (0..200).any(|_| {
        if s.write_all(b"1\r\nx\r\n").is_err() {
            return true;
        }
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => true,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(_) => true,
        }
    });
    assert!(
        cut_off,
        "a body at 3 bytes a second was let through for a minute"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "cut off with a 4xx or a closed connection: {answer}"
    );
    // The server still serves, and the session is still there to be continued or cancelled.
    let r = Client::new()
        .get(format!("{}{location}", server.url()))
        .send()
        .unwrap();
    assert_eq!(r.status(), 204, "the upload session survives");
}

#[test]
fn a_client_is_held_to_its_cap_of_uploads_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(&dir.path().join("data"), &["--max-uploads-per-client", "2"]);
    let base = server.url();
    let held: Vec<TcpStream> = (0..2)
        .map(|_| open_trickle(&server.addr, &start_upload(&base, "greedy/up")))
        .collect();
    // The two trickling PATCHes hold both slots; wait until the server has taken them (a third
    // is refused), with no fixed sleep.
    let third = start_upload(&base, "greedy/up");
    let refused = (0..200).find_map(|_| {
        let r = Client::new()
            .patch(format!("{base}{third}"))
            .body(vec![7u8; 100])
            .send()
            .unwrap();
        if r.status() == 429 {
            Some(r)
        } else {
            std::thread::sleep(Duration::from_millis(50));
            None
        }
    });
    let refused = refused.expect("a third concurrent upload is refused with 429");
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "TOOMANYREQUESTS");
    // Reads are not uploads: still served.
    assert_eq!(
        Client::new()
            .get(format!("{base}/v2/"))
            .send()
            .unwrap()
            .status(),
        200
    );
    // Once the held uploads end, uploads are accepted again.
    drop(held);
    let accepted = (0..200).any(|_| {
        let r = Client::new()
            .post(format!("{base}/v2/greedy/up/blobs/uploads/"))
            .body(b"abc".to_vec())
            .query(&[(
                "digest",
                vial_core::Algorithm::Sha256.digest_bytes(b"abc").as_str(),
            )])
            .send()
            .unwrap();
        if r.status() == 201 {
            return true;
        }
        assert_eq!(r.status(), 429);
        std::thread::sleep(Duration::from_millis(50));
        false
    });
    assert!(accepted, "the slots come back when the uploads end");
}

#[test]
fn every_request_has_an_id_in_its_answer_and_its_log_lines_and_credentials_never_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = Server::start_logging(&dir.path().join("data"), &[], "trace", &log);
    let c = Client::new();
    let r = c
        .get(format!("{}/v2/nothing/here/tags/list", server.url()))
        .header("authorization", "Bearer SECRET-TOKEN-VALUE")
        .header("cookie", "session=SECRET-COOKIE-VALUE")
        .header("x-request-id", "req-from-the-client-1")
        .send()
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "req-from-the-client-1");
    let r = c.get(format!("{}/v2/", server.url())).send().unwrap();
    let made_up = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(
        made_up.len(),
        36,
        "a UUID when the client sent none: {made_up}"
    );
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("SECRET-TOKEN-VALUE"), "{text}");
    assert!(!text.contains("SECRET-COOKIE-VALUE"), "{text}");
    assert!(text.contains("Sensitive"), "redacted, not dropped: {text}");
    let of_request: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("req-from-the-client-1"))
        .collect();
    assert!(
        of_request.iter().any(|l| l.contains("request done")),
        "the request's own log lines carry its id: {text}"
    );
    assert!(!text.contains('\u{1b}'), "no colour codes in a log file");
}

#[test]
fn json_listings_are_gzipped_for_clients_that_ask_and_manifests_never_are() {
    let server = Server::start();
    let base = server.url();
    let c = Client::new();
    let blob = push_blob(&c, &base, "gz/m", b"layer");
    for i in 0..40 {
        push_manifest(
            &c,
            &base,
            "gz/m",
            &format!("tag-{i:03}"),
            &[(blob.clone(), 5)],
        );
    }
    // reqwest without its gzip feature sends no Accept-Encoding: say it by hand.
    let r = c
        .get(format!("{base}/v2/gz/m/tags/list"))
        .header("accept-encoding", "gzip")
        .send()
        .unwrap();
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let mut tags = String::new();
    flate2::read::GzDecoder::new(&r.bytes().unwrap()[..])
        .read_to_string(&mut tags)
        .unwrap();
    let tags: serde_json::Value = serde_json::from_str(&tags).unwrap();
    assert_eq!(tags["tags"].as_array().unwrap().len(), 40);
    let r = c.get(format!("{base}/v2/gz/m/tags/list")).send().unwrap();
    assert!(
        r.headers().get("content-encoding").is_none(),
        "only when asked"
    );
    let r = c
        .get(format!("{base}/v2/gz/m/manifests/tag-000"))
        .header("accept-encoding", "gzip")
        .send()
        .unwrap();
    assert!(
        r.headers().get("content-encoding").is_none(),
        "manifest bytes are served as pushed"
    );
}
