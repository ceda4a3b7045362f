//! Hostile input, generated: a seeded stream of 1,500 malformed, mismatched and unauthorized
//! requests (paths, methods, ranges, uploads, manifests, tokens, extensions) against a registry
//! with authentication rules, and 1,500 more against one without. Nothing may answer 5xx, no
//! handler may panic in either server, every error must be the OCI envelope, no identity may change
//! what its rules forbid, and no identity may read (2xx on a repository path) where its rules do not
//! let it pull. The seed is new every run and printed; `VIAL_HOSTILE_SEED=0x…` replays one.

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
        // A forged credential may get at most what no credential gets: a registry may ignore a
        // header it does not use (a Basic one where tokens are expected) and serve anonymously.
        (Who::Anonymous | Who::Forged, "pull") => repo.starts_with("public/"),
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
        r = r.header("range", hostile_range(rng));
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

/// The right a successful request of `method` on a repository's `path` needs: what it changes
/// beyond pull (push or delete), else pull, since every 2xx on a repository path shows something
/// of the repository (a blob, a manifest, a tag list, a version list, a lease, a job). Presence
/// checks and leases are writes a puller may make.
fn needs(method: &Method, path: &str) -> &'static str {
    needs_beyond_pull(method, path).unwrap_or("pull")
}

/// Whether a request of `method` on `path` would change something in `repo` that needs `action`
/// beyond pull: the requests whose success by someone without that right is a bypass.
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

/// A read of something that exists (a seeded blob or manifest, in the repository that holds it),
/// often with a hostile `Range`: the requests that reach the byte-range arithmetic, and whose
/// success for a caller without pull rights is a read bypass. Returns (method, path).
fn plausible_read(rng: &mut Rng, known: &[(String, u64)]) -> (Method, String) {
    // The seeds: known[0] lives in team/secret, known[1] in public/open.
    let (repo, blob) = match rng.below(2) {
        0 => ("team/secret", &known[0].0),
        _ => ("public/open", &known[1].0),
    };
    let target = match rng.below(4) {
        0 => format!("manifests/{}", rng.pick(&["v1", "t0", "t1"])),
        1 => "tags/list".to_owned(),
        _ => format!("blobs/{blob}"),
    };
    let method = if rng.chance(25) {
        Method::HEAD
    } else {
        Method::GET
    };
    (method, format!("/v2/{repo}/{target}"))
}

/// A `Range` header from the edges of what parses: reversed, empty, multiple, other units, and
/// bounds at and past 2^64.
fn hostile_range(rng: &mut Rng) -> &'static str {
    const RANGES: &[&str] = &[
        "bytes=0-0",
        "bytes=5-2",
        "bytes=-0",
        "bytes=-1",
        "bytes=-18446744073709551615",
        "bytes=0-18446744073709551615",
        "bytes=18446744073709551615-18446744073709551615",
        "bytes=18446744073709551614-",
        "bytes=99999999999999999999-",
        "bytes=1-18446744073709551614",
        "bytes=0-1,3-4",
        "items=0-1",
        "bytes=",
    ];
    *rng.pick(RANGES)
}

struct Outcome {
    /// Requests that got an answer (each one did, or the run failed).
    answered: usize,
    /// Repositories a caller allowed to push or delete there changed with a 2xx.
    writes_by_alice: BTreeSet<String>,
    /// Every successful request that needed more than pull: (method, path).
    writes: Vec<(Method, String)>,
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
    let mut writes = Vec::new();
    let mut answered = 0;
    // The request before, on the connection a dropped one was likely reusing.
    let mut previous = String::from("none");
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
        // A fifth of the storm reads what exists (with hostile ranges), a third of the rest
        // writes in well-formed ways, so that refusals are tested where acceptance would have
        // been possible and the range arithmetic meets real blobs; the rest is malformed in every
        // way.
        let (method, path, url, mut request) = if rng.chance(20) {
            let (method, path) = plausible_read(&mut rng, known);
            let url = format!("{base}{path}");
            let mut request = client.request(method.clone(), &url);
            if rng.chance(70) {
                request = request.header("range", hostile_range(&mut rng));
            }
            let repo = repo_of(&path).unwrap_or_default();
            if let Some(h) = tokens.header(who, &repo, &mut rng) {
                request = request.header("authorization", h);
            }
            (method, path, url, request)
        } else if rng.chance(40) {
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
        let what = format!("seed {seed:#x} #{i} {who:?} {method} {url}");
        let response = request.send().unwrap_or_else(|e| {
            panic!(
                "{what}: no answer (a dropped connection?): {e:?}; the request before: {previous}"
            )
        });
        answered += 1;
        let status = response.status().as_u16();
        previous = format!("{method} {url}: {status}");
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
                // Reads included: a 2xx GET or HEAD of a private repository's blob, manifest,
                // tags or extensions by a caller who may not pull there is a bypass too.
                let action = needs(&method, &path);
                assert!(
                    may(who, &repo, action),
                    "{what}: {status} although {who:?} may not {action} {repo}: an authorization bypass"
                );
                if action != "pull" {
                    writes.push((method.clone(), path.clone()));
                }
                // A presence check writes (links) only for who may push there.
                if action != "pull" || may(who, &repo, "push") {
                    writes_by_alice.insert(repo);
                }
            }
            assert_ne!(
                path, "/v2/_vial/gc",
                "{what}: nobody may delete everywhere, so nobody may run GC"
            );
        }
    }
    eprintln!("hostile requests (seed {seed:#x}) by status: {statuses:?}");
    Outcome {
        answered,
        writes_by_alice,
        writes,
        statuses,
    }
}

/// Pushes a blob and a manifest tagged v1 into `repo` as `token`'s holder; returns the blob.
fn seed_repo(
    c: &Client,
    base: &str,
    repo: &str,
    token: Option<&str>,
    bytes: &[u8],
) -> (String, u64) {
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

/// The storm's seed: `VIAL_HOSTILE_SEED` (decimal or 0x…) to replay a failure, else new each run.
fn storm_seed() -> u64 {
    let seed = match std::env::var("VIAL_HOSTILE_SEED") {
        Ok(v) => match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|e| panic!("VIAL_HOSTILE_SEED={v:?}: {e}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    // The generator is xorshift: a zero state would stay zero.
    let seed = seed | 1;
    eprintln!("hostile storm seed {seed:#x} (replay with VIAL_HOSTILE_SEED={seed:#x})");
    seed
}

/// The lines of a server log that show a handler panicked.
fn panics_in(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()))
        .lines()
        .filter(|l| l.contains("panicked"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn hostile_requests_get_no_5xx_no_panic_and_no_authorization_bypass() {
    const STORM: usize = 1500;
    let seed = storm_seed();
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
        seed_repo(
            &c,
            &base,
            "team/secret",
            Some(&secret_token),
            &pseudo_random(3000, 1),
        ),
        seed_repo(
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
    assert!(secret_before.is_some(), "the seed tag resolves");

    let outcome = assault(&server, true, STORM, seed, &known);
    assert_eq!(outcome.answered, STORM, "seed {seed:#x}");
    // The storm reached every layer: refusals at the door, and requests that got through.
    for status in [200, 201, 202, 400, 401, 403, 404, 405] {
        assert!(
            outcome.statuses.get(&status).copied().unwrap_or(0) >= 5,
            "seed {seed:#x}: too few {status} answers to trust the run: {:?}",
            outcome.statuses
        );
    }

    // The seed tag of the private repository moved only if an allowed caller wrote to that very
    // tag or to the manifest it names; otherwise a refused request changed it after all.
    let seed_manifest_paths = [
        "/v2/team/secret/manifests/v1".to_owned(),
        format!(
            "/v2/team/secret/manifests/{}",
            secret_before.clone().unwrap_or_default()
        ),
    ];
    let tag_written = outcome
        .writes
        .iter()
        .any(|(_, path)| seed_manifest_paths.contains(path));
    if !tag_written {
        assert_eq!(
            tag_of("team/secret", &secret_token),
            secret_before,
            "seed {seed:#x}: team/secret:v1 moved, but no allowed request wrote it"
        );
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
            "seed {seed:#x}: {repo} exists, but only callers without push rights wrote to it: {catalog}"
        );
        assert!(
            may(Who::Alice, repo, "push"),
            "seed {seed:#x}: {repo} was created outside alice's rules"
        );
    }
    assert_eq!(c.get(format!("{base}/v2/")).send().unwrap().status(), 401);
    drop(server);
    let panics = panics_in(&log);
    assert!(
        panics.is_empty(),
        "seed {seed:#x}: a handler panicked: {panics:#?}"
    );

    // The same storm without authentication: still no 5xx, the envelope on every error, and no
    // panic in that server's log either.
    let open_dir = tempfile::tempdir().unwrap();
    let open_log = open_dir.path().join("server.log");
    let open = Server::start_logging(&open_dir.path().join("data"), &[], "warn", &open_log);
    let open_known = vec![
        seed_repo(
            &c,
            &open.url(),
            "team/secret",
            None,
            &pseudo_random(3000, 1),
        ),
        seed_repo(&c, &open.url(), "public/open", None, &pseudo_random(500, 2)),
    ];
    let second = assault(&open, false, STORM, seed.rotate_left(17) | 1, &open_known);
    assert_eq!(second.answered, STORM, "seed {seed:#x}");
    for status in [200, 201, 202, 400, 404] {
        assert!(
            second.statuses.get(&status).copied().unwrap_or(0) >= 5,
            "seed {seed:#x}: too few {status} answers from the open server: {:?}",
            second.statuses
        );
    }
    assert_eq!(
        c.get(format!("{}/v2/", open.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
    drop(open);
    let panics = panics_in(&open_log);
    assert!(
        panics.is_empty(),
        "seed {seed:#x}: a handler of the open server panicked: {panics:#?}"
    );
}
