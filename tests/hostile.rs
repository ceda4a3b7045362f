//! Hostile input, generated: a seeded stream of well over 1,500 malformed, mismatched and
//! unauthorized requests (paths, methods, ranges, uploads, manifests, tokens, extensions) against
//! a registry with authentication rules and one without. Nothing may answer 5xx, no handler may
//! panic, every error must be the OCI envelope, and no identity may change what its rules forbid.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use reqwest::blocking::{Client, RequestBuilder};
use reqwest::Method;

use crate::support::oci::pseudo_random;
use crate::support::Server;

/// A small deterministic generator: the same seed makes the same requests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Who {
    Anonymous,
    /// May pull everywhere and push nowhere.
    Bob,
    /// May push and delete in team/* and public/*, and pull everywhere.
    Alice,
    /// A token that is not one: garbage, or alice's with its signature broken.
    Forged,
}

const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// What the rules of [`config`] let `who` do in `repo`.
fn may(who: Who, repo: &str, action: &str) -> bool {
    let team_or_public = repo.starts_with("team/") || repo.starts_with("public/");
    match (who, action) {
        (Who::Alice, "pull") => true,
        (Who::Alice, "push" | "delete") => team_or_public,
        (Who::Bob, "pull") => true,
        (Who::Anonymous, "pull") => repo.starts_with("public/"),
        _ => false,
    }
}

fn config(dir: &Path) -> std::path::PathBuf {
    let key = dir.join("token.key");
    std::fs::write(&key, pseudo_random(32, 11)).unwrap();
    let path = dir.join("vial.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[auth]
token-key-file = "{key}"
token-ttl = "1h"

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
repositories = "public/*"
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
            alice = bcrypt::hash("alice-pw", 4).unwrap(),
            bob = bcrypt::hash("bob-pw", 4).unwrap(),
        ),
    )
    .unwrap();
    path
}

/// Tokens per identity and repository, fetched once.
struct Tokens {
    base: String,
    client: Client,
    cache: HashMap<(Who, String), Option<String>>,
}

impl Tokens {
    fn header(&mut self, who: Who, repo: &str, rng: &mut Rng) -> Option<String> {
        let user = match who {
            Who::Anonymous => return None,
            Who::Forged => {
                return Some(match rng.below(4) {
                    0 => "Bearer not-a-token".to_owned(),
                    1 => "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.".to_owned(),
                    2 => "Basic YWxpY2U6YWxpY2UtcHc=".to_owned(),
                    _ => {
                        let real = self.token(Who::Alice, repo)?;
                        let mut forged = real.into_bytes();
                        let at = forged.len() - 3;
                        forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
                        format!("Bearer {}", String::from_utf8(forged).ok()?)
                    }
                })
            }
            Who::Alice | Who::Bob => who,
        };
        self.token(user, repo).map(|t| format!("Bearer {t}"))
    }

    fn token(&mut self, who: Who, repo: &str) -> Option<String> {
        let (user, password) = match who {
            Who::Alice => ("alice", "alice-pw"),
            _ => ("bob", "bob-pw"),
        };
        let key = (who, repo.to_owned());
        if let Some(t) = self.cache.get(&key) {
            return t.clone();
        }
        let r = self
            .client
            .get(format!("{}/token", self.base))
            .query(&[
                ("service", "vial"),
                ("scope", &format!("repository:{repo}:pull,push,delete")),
                ("scope", "registry:catalog:*"),
            ])
            .basic_auth(user, Some(password))
            .send()
            .unwrap();
        assert!(r.status().as_u16() < 500, "token endpoint: {}", r.status());
        let t = if r.status() == 200 {
            r.json::<serde_json::Value>().unwrap()["token"]
                .as_str()
                .map(str::to_owned)
        } else {
            None
        };
        self.cache.insert(key, t.clone());
        t
    }
}

const REPOS: &[&str] = &[
    "team/secret",
    "team/new",
    "public/open",
    "public/fresh",
    "other/thing",
    "UPPER/case",
    "a/../b",
    "a//b",
    "_vial",
    "x",
    "%2e%2e/etc",
    "very/deep/name/with/many/components/indeed",
];

const REFERENCES: &[&str] = &[
    "v1",
    "latest",
    ".INVALID_MANIFEST_NAME",
    EMPTY,
    "sha256:nothex",
    "sha512:00",
    "md5:d41d8cd98f00b204e9800998ecf8427e",
    "a:b:c",
    "..",
    "%00",
];

fn digest(rng: &mut Rng, known: &[String]) -> String {
    match rng.below(5) {
        0 | 1 => rng.pick(known).clone(),
        2 => EMPTY.to_owned(),
        3 => "sha256:xyz".to_owned(),
        _ => format!("blake3:{}", "ab".repeat(32)),
    }
}

fn path(rng: &mut Rng, repo: &str, known: &[String]) -> String {
    let d = digest(rng, known);
    match rng.below(20) {
        0 => "/v2/".to_owned(),
        1 => "/v2/_catalog".to_owned(),
        2 => "/v2/_vial/gc".to_owned(),
        3 | 4 => format!("/v2/{repo}/manifests/{}", rng.pick(REFERENCES)),
        5 | 6 => format!("/v2/{repo}/blobs/{d}"),
        7 | 8 => format!("/v2/{repo}/blobs/uploads/"),
        9 => format!(
            "/v2/{repo}/blobs/uploads/{}",
            rng.pick(&[
                "00000000-0000-4000-8000-000000000000",
                "../../etc/passwd",
                "x",
            ])
        ),
        10 => format!("/v2/{repo}/tags/list"),
        11 => format!("/v2/{repo}/referrers/{d}"),
        12 => format!("/v2/{repo}/_vial/blobs/present"),
        13 => format!("/v2/{repo}/_vial/versions"),
        14 => format!("/v2/{repo}/_vial/seal/{d}"),
        15 => format!("/v2/{repo}/_vial/restore/{d}"),
        16 => format!("/v2/{repo}/_vial/tags/{}/history", rng.pick(REFERENCES)),
        17 => format!("/v2/{repo}/_vial/sync"),
        18 => format!("/v2/{repo}/_vial/sync/{}", rng.pick(&["0f0f", "..", "x"])),
        _ => format!(
            "/v2/{repo}/{}",
            rng.pick(&["", "nothing", "blobs", "_vial/x"])
        ),
    }
}

fn query(rng: &mut Rng, known: &[String]) -> String {
    let d = digest(rng, known);
    let options = [
        String::new(),
        "?n=0".into(),
        "?n=18446744073709551616".into(),
        "?n=-1&last=zzz".into(),
        format!("?digest={d}"),
        format!("?mount={d}&from=team/secret"),
        format!("?mount={d}&from=../x"),
        "?wait=1e20".into(),
        "?wait=NaN".into(),
        "?wait=0.05".into(),
        "?tag=v1&tag=.bad".into(),
        "?dry-run=true".into(),
        "?deleted=true".into(),
        "?digest-algorithm=blake3".into(),
        "?digest-algorithm=md5".into(),
        "?artifactType=application/x".into(),
        "?%zz=%".into(),
    ];
    rng.pick(&options).clone()
}

fn manifest_body(rng: &mut Rng, known: &[(String, u64)]) -> Vec<u8> {
    let (d, size) = rng.pick(known).clone();
    let size = if rng.chance(30) { size + 1 } else { size };
    let media = *rng.pick(&[
        vial_core::media::OCI_MANIFEST,
        vial_core::media::OCI_INDEX,
        vial_core::media::DOCKER_MANIFEST,
        "text/plain",
    ]);
    let v = match rng.below(5) {
        0 => serde_json::json!({"schemaVersion": 2, "mediaType": media,
            "config": {"mediaType": vial_core::media::OCI_EMPTY, "digest": EMPTY, "size": 0},
            "layers": [{"mediaType": "application/octet-stream", "digest": d, "size": size}]}),
        1 => serde_json::json!({"schemaVersion": 2, "mediaType": media,
            "manifests": [{"mediaType": vial_core::media::OCI_MANIFEST, "digest": d, "size": size}]}),
        2 => serde_json::json!({"schemaVersion": 1, "mediaType": media, "layers": "nope"}),
        3 => serde_json::json!({"schemaVersion": 2, "mediaType": media,
            "config": {"mediaType": "x", "digest": "sha256:1", "size": -1}, "layers": [],
            "subject": {"mediaType": media, "digest": d, "size": size}}),
        _ => return pseudo_random(rng.below(3000), rng.next()),
    };
    serde_json::to_vec(&v).unwrap()
}

fn body(rng: &mut Rng, path: &str, known: &[(String, u64)]) -> Vec<u8> {
    let digests: Vec<&String> = known.iter().map(|(d, _)| d).collect();
    if path.contains("/manifests/") {
        return manifest_body(rng, known);
    }
    if path.ends_with("/_vial/blobs/present") {
        return match rng.below(3) {
            0 => serde_json::to_vec(&serde_json::json!({ "digests": digests })).unwrap(),
            1 => br#"{"digests": ["sha256:zz"]}"#.to_vec(),
            _ => serde_json::to_vec(&serde_json::json!({ "digests": vec![EMPTY; 5000] })).unwrap(),
        };
    }
    if path.ends_with("/_vial/sync") {
        return match rng.below(3) {
            0 => br#"{"source": "file:///etc", "tag": "x"}"#.to_vec(),
            1 => br#"{"source": "s3://b/p", "tag": "../x", "include": ["["]}"#.to_vec(),
            _ => b"[]".to_vec(),
        };
    }
    match rng.below(4) {
        0 => Vec::new(),
        1 => b"{}".to_vec(),
        _ => pseudo_random(rng.below(70_000), rng.next()),
    }
}

fn headers(rng: &mut Rng, mut r: RequestBuilder) -> RequestBuilder {
    if rng.chance(30) {
        r = r.header(
            "range",
            *rng.pick(&[
                "bytes=0-0",
                "bytes=5-2",
                "bytes=-0",
                "bytes=0-18446744073709551615",
                "bytes=99999999999999999999-",
                "bytes=0-1,3-4",
                "items=0-1",
                "bytes=",
            ]),
        );
    }
    if rng.chance(30) {
        r = r.header(
            "content-range",
            *rng.pick(&["0-0", "5-2", "0-18446744073709551615", "x", "bytes 0-1/2"]),
        );
    }
    if rng.chance(40) {
        r = r.header(
            "content-type",
            *rng.pick(&[
                vial_core::media::OCI_MANIFEST,
                vial_core::media::OCI_INDEX,
                "application/json",
                "application/octet-stream",
                "text/plain; charset=utf-8",
                "",
            ]),
        );
    }
    if rng.chance(15) {
        r = r.header(
            *rng.pick(&["if-match", "if-none-match"]),
            *rng.pick(&["*", "\"sha256:zz\"", EMPTY, "W/\"x\""]),
        );
    }
    if rng.chance(10) {
        r = r.header(
            "vial-tag-expires",
            *rng.pick(&["yesterday", "1970-01-01T00:00:00Z", "9999-99-99"]),
        );
    }
    r
}

/// Whether a request of `method` on `path` would change something in `repo` that needs `action`
/// beyond pull: the requests whose success by someone without that right is a bypass. Presence
/// checks and leases are writes a puller may make; they are checked by their effects instead.
fn needs_beyond_pull(method: &Method, path: &str) -> Option<&'static str> {
    let extension = |name: &str| path.contains(&format!("/_vial/{name}"));
    if extension("blobs/present") || extension("leases") {
        return None;
    }
    if *method == Method::DELETE {
        return Some(if extension("sync") { "push" } else { "delete" });
    }
    if extension("restore") && *method == Method::POST {
        return Some("delete");
    }
    match *method {
        Method::PUT | Method::POST | Method::PATCH => Some("push"),
        _ => None,
    }
}

fn repo_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v2/")?;
    let cut = ["/manifests/", "/blobs/", "/tags/", "/referrers/", "/_vial/"]
        .iter()
        .filter_map(|m| rest.rfind(m))
        .max()?;
    Some(rest[..cut].to_owned())
}

/// A well-formed request that would change something (a blob upload, an upload session, a
/// manifest over known blobs, a tag deletion): the requests whose refusal to the wrong caller
/// matters most. Returns (method, path with query, body, content type).
fn plausible_write(
    rng: &mut Rng,
    repo: &str,
    known: &[(String, u64)],
) -> (Method, String, Vec<u8>, Option<&'static str>) {
    match rng.below(5) {
        0 => {
            let bytes = pseudo_random(1 + rng.below(5000), rng.next());
            let d = vial_core::Algorithm::Sha256.digest_bytes(&bytes);
            (
                Method::POST,
                format!("/v2/{repo}/blobs/uploads/?digest={d}"),
                bytes,
                Some("application/octet-stream"),
            )
        }
        1 => (
            Method::POST,
            format!("/v2/{repo}/blobs/uploads/"),
            Vec::new(),
            None,
        ),
        2 => {
            let (d, size) = rng.pick(known).clone();
            let m = serde_json::json!({"schemaVersion": 2, "mediaType": vial_core::media::OCI_MANIFEST,
                "config": {"mediaType": vial_core::media::OCI_EMPTY, "digest": EMPTY, "size": 0},
                "layers": [{"mediaType": "application/octet-stream", "digest": d, "size": size}],
                "annotations": {"n": rng.next().to_string()}});
            (
                Method::PUT,
                format!("/v2/{repo}/manifests/t{}", rng.below(5)),
                serde_json::to_vec(&m).unwrap(),
                Some(vial_core::media::OCI_MANIFEST),
            )
        }
        3 => (
            Method::POST,
            format!(
                "/v2/{repo}/blobs/uploads/?mount={}&from=team/secret",
                rng.pick(known).0
            ),
            Vec::new(),
            None,
        ),
        _ => (
            Method::DELETE,
            format!("/v2/{repo}/manifests/t{}", rng.below(5)),
            Vec::new(),
            None,
        ),
    }
}

struct Outcome {
    requests: usize,
    writes_by_alice: BTreeSet<String>,
    /// How many answers had each status, to show the storm reached past the front door.
    statuses: std::collections::BTreeMap<u16, usize>,
}

fn assault(
    server: &Server,
    with_auth: bool,
    count: usize,
    seed: u64,
    known: &[(String, u64)],
) -> Outcome {
    let base = server.url();
    let client = Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut tokens = Tokens {
        base: base.clone(),
        client: client.clone(),
        cache: HashMap::new(),
    };
    let digests: Vec<String> = known.iter().map(|(d, _)| d.clone()).collect();
    let mut rng = Rng(seed);
    let mut writes_by_alice = BTreeSet::new();
    let mut statuses = std::collections::BTreeMap::new();
    let methods = [
        Method::GET,
        Method::HEAD,
        Method::PUT,
        Method::POST,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
    ];
    for i in 0..count {
        let repo = rng.pick(REPOS).to_string();
        let who = if with_auth {
            *rng.pick(&[Who::Anonymous, Who::Bob, Who::Alice, Who::Forged])
        } else {
            Who::Anonymous
        };
        // A third of the storm is well formed, so that refusals are tested where acceptance
        // would have been possible; the rest is malformed in every way.
        let (method, path, url, mut request) = if rng.chance(33) {
            let repo = *rng.pick(&["team/secret", "team/new", "public/open", "public/fresh"]);
            let (method, path_query, bytes, content_type) = plausible_write(&mut rng, repo, known);
            let mut request = client
                .request(method.clone(), format!("{base}{path_query}"))
                .body(bytes);
            if let Some(t) = content_type {
                request = request.header("content-type", t);
            }
            let path = path_query.split('?').next().unwrap_or_default().to_owned();
            if let Some(h) = tokens.header(who, repo, &mut rng) {
                request = request.header("authorization", h);
            }
            (method, path, format!("{base}{path_query}"), request)
        } else {
            let path = path(&mut rng, &repo, &digests);
            let method = rng.pick(&methods).clone();
            let url = format!("{base}{path}{}", query(&mut rng, &digests));
            let mut request = headers(&mut rng, client.request(method.clone(), &url));
            if let Some(h) = tokens.header(who, &repo, &mut rng) {
                request = request.header("authorization", h);
            }
            if matches!(method, Method::PUT | Method::POST | Method::PATCH) {
                request = request.body(body(&mut rng, &path, known));
            }
            (method, path, url, request)
        };
        request = request.timeout(Duration::from_secs(60));
        let what = format!("#{i} {who:?} {method} {url}");
        let response = request
            .send()
            .unwrap_or_else(|e| panic!("{what}: no answer (a dropped connection?): {e}"));
        let status = response.status().as_u16();
        *statuses.entry(status).or_default() += 1;
        let headers = response.headers().clone();
        let text = response.text().unwrap_or_default();
        assert!(status < 500, "{what}: {status} {text}");
        if status >= 400 && method != Method::HEAD && path.starts_with("/v2") {
            let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("{what}: {status} without the OCI envelope ({e}): {text:?}")
            });
            assert!(
                json["errors"][0]["code"].is_string() && json["errors"][0]["message"].is_string(),
                "{what}: {text}"
            );
        }
        if status == 401 {
            let challenge = headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("{what}: 401 without a challenge"));
            assert!(
                challenge.starts_with("Bearer realm=\""),
                "{what}: {challenge}"
            );
        }
        let ok = (200..300).contains(&status);
        if with_auth && ok {
            if let Some(repo) = repo_of(&path) {
                match needs_beyond_pull(&method, &path) {
                    Some(action) => {
                        assert!(
                            may(who, &repo, action),
                            "{what}: {status} although {who:?} may not {action} {repo}: an authorization bypass"
                        );
                        writes_by_alice.insert(repo);
                    }
                    // A presence check writes (links) only for who may push there.
                    None if may(who, &repo, "push") => {
                        writes_by_alice.insert(repo);
                    }
                    None => {}
                }
            }
            assert_ne!(
                path, "/v2/_vial/gc",
                "{what}: nobody may delete everywhere, so nobody may run GC"
            );
        }
    }
    eprintln!("hostile requests by status: {statuses:?}");
    Outcome {
        requests: count,
        writes_by_alice,
        statuses,
    }
}

/// Pushes a blob and a manifest tagged v1 into `repo` as `token`'s holder; returns the blob.
fn seed(c: &Client, base: &str, repo: &str, token: Option<&str>, bytes: &[u8]) -> (String, u64) {
    let with = |r: RequestBuilder| match token {
        Some(t) => r.header("authorization", format!("Bearer {t}")),
        None => r,
    };
    let digest = vial_core::Algorithm::Sha256.digest_bytes(bytes).to_string();
    for (d, b) in [(digest.as_str(), bytes), (EMPTY, &b""[..])] {
        let r = with(c.post(format!("{base}/v2/{repo}/blobs/uploads/?digest={d}")))
            .body(b.to_vec())
            .send()
            .unwrap();
        assert_eq!(r.status(), 201, "seed blob");
    }
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": vial_core::media::OCI_MANIFEST,
        "config": {"mediaType": vial_core::media::OCI_EMPTY, "digest": EMPTY, "size": 0},
        "layers": [{"mediaType": "application/octet-stream", "digest": digest, "size": bytes.len()}]});
    let r = with(c.put(format!("{base}/v2/{repo}/manifests/v1")))
        .header("content-type", vial_core::media::OCI_MANIFEST)
        .body(serde_json::to_vec(&manifest).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "seed manifest");
    (digest, bytes.len() as u64)
}

#[test]
fn hostile_requests_get_no_5xx_no_panic_and_no_authorization_bypass() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let config = config(dir.path());
    let server = Server::start_logging(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        "warn",
        &log,
    );
    let base = server.url();
    let c = Client::new();
    let mut tokens = Tokens {
        base: base.clone(),
        client: c.clone(),
        cache: HashMap::new(),
    };
    let alice = |tokens: &mut Tokens, repo: &str| tokens.token(Who::Alice, repo).unwrap();
    let secret_token = alice(&mut tokens, "team/secret");
    let open_token = alice(&mut tokens, "public/open");
    let known = vec![
        seed(
            &c,
            &base,
            "team/secret",
            Some(&secret_token),
            &pseudo_random(3000, 1),
        ),
        seed(
            &c,
            &base,
            "public/open",
            Some(&open_token),
            &pseudo_random(500, 2),
        ),
    ];
    let tag_of = |repo: &str, token: &str| {
        c.get(format!("{base}/v2/{repo}/manifests/v1"))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .unwrap()
            .headers()
            .get("docker-content-digest")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let secret_before = tag_of("team/secret", &secret_token);

    let outcome = assault(&server, true, 1300, 0x5eed_0001, &known);
    // The storm reached every layer: refusals at the door, and requests that got through.
    for status in [200, 201, 202, 400, 401, 403, 404, 405] {
        assert!(
            outcome.statuses.get(&status).copied().unwrap_or(0) >= 5,
            "too few {status} answers to trust the run: {:?}",
            outcome.statuses
        );
    }

    // The seeds that only alice could change are intact unless alice wrote there.
    if !outcome.writes_by_alice.contains("team/secret") {
        assert_eq!(tag_of("team/secret", &secret_token), secret_before);
    }
    // No repository exists that nobody allowed to push there wrote to.
    let catalog_token = alice(&mut tokens, "team/secret");
    let catalog: serde_json::Value = c
        .get(format!("{base}/v2/_catalog"))
        .header("authorization", format!("Bearer {catalog_token}"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    for repo in catalog["repositories"].as_array().unwrap() {
        let repo = repo.as_str().unwrap();
        assert!(
            repo == "team/secret"
                || repo == "public/open"
                || outcome.writes_by_alice.contains(repo),
            "{repo} exists, but only callers without push rights wrote to it: {catalog}"
        );
        assert!(
            may(Who::Alice, repo, "push"),
            "{repo} was created outside alice's rules"
        );
    }
    assert_eq!(c.get(format!("{base}/v2/")).send().unwrap().status(), 401);
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("panicked"), "a handler panicked:\n{text}");

    // The same storm without authentication: still no 5xx and the envelope on every error.
    let open = Server::start();
    let open_known = vec![
        seed(
            &c,
            &open.url(),
            "team/secret",
            None,
            &pseudo_random(3000, 1),
        ),
        seed(&c, &open.url(), "public/open", None, &pseudo_random(500, 2)),
    ];
    let second = assault(&open, false, 400, 0x5eed_0002, &open_known);
    assert!(outcome.requests + second.requests >= 1500);
    assert_eq!(
        c.get(format!("{}/v2/", open.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
}
